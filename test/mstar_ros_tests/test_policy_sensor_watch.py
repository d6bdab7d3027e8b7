"""Sensor data fit to act on: stamps (stale, future, frozen, none), age by stamp and arrival, loss."""

from __future__ import annotations

import math

from mstar_ros.policy.sensor_watch import SensorWatch

SENSORS = ["cam", "joints"]


def test_verdicts_by_stamp():
    w = SensorWatch(SENSORS, max_age_s=0.5, timeout_s=1.0)
    assert w.check("cam", 99.8, clock_now=100.0).kind == "ok"
    assert w.check("cam", 99.0, clock_now=100.0).kind == "stale"
    assert w.check("cam", 101.0, clock_now=100.0).kind == "future"
    assert w.check("cam", 0.0, clock_now=100.0).kind == "unstamped" and w.check("cam", 0.0, 100.0).usable
    w.accept("cam", 99.8, arrival=10.0)
    frozen = w.check("cam", 99.8, clock_now=100.1)
    assert frozen.kind == "frozen" and not frozen.usable and "same header.stamp" in frozen.text
    assert "restamp" in w.check("cam", 50.0, 100.0).text  # says how to fix a replayed bag


def test_age_is_the_oldest_sensor_by_stamp_or_arrival():
    w = SensorWatch(SENSORS, max_age_s=0.5, timeout_s=1.0)
    assert w.age(10.0, 100.0) == math.inf and not w.has_all()
    w.accept("cam", 99.9, arrival=10.0)
    w.accept("joints", 0.0, arrival=10.2)  # unstamped: arrival only
    assert w.has_all() and w.fed_once
    assert abs(w.age(10.3, 100.0) - 0.3) < 1e-9  # cam arrived 0.3 s ago (its stamp says 0.1 s)
    assert abs(w.age(10.3, 100.6) - 0.7) < 1e-9  # ... but by the clock its stamp is 0.7 s old
    assert w.oldest_sensor(10.3, 100.6) == "cam"


def test_loss_only_after_being_fed_and_past_the_timeout():
    w = SensorWatch(SENSORS, max_age_s=0.5, timeout_s=1.0)
    assert not w.lost(1000.0, 1000.0)  # never fed: waiting, not lost
    w.accept("cam", 0.0, arrival=0.0)
    w.accept("joints", 0.0, arrival=0.0)
    assert not w.lost(0.9, 0.0) and w.lost(1.1, 0.0)
    w.accept("cam", 0.0, arrival=1.2)
    assert w.lost(1.3, 0.0)  # the joints are still old
    w.accept("joints", 0.0, arrival=1.3)
    assert not w.lost(1.4, 0.0)
