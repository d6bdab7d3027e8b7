"""When a due request waits for the next camera frame (the policy node and the bench share the rule)."""

from __future__ import annotations

import pytest

from mstar_ros.bench.pi05_loads import waits_for_next
from mstar_ros.policy.freshness import FrameFreshness, worth_waiting

PERIOD = 1 / 15  # the synthetic bag's cameras


def test_waiting_pays_only_past_half_a_period():
    assert worth_waiting(0.06, 0.1) and not worth_waiting(0.04, 0.1)
    assert not worth_waiting(0.05, 0.1)  # at half a period the wait equals the age it removes
    assert not worth_waiting(1.0, 0.0)


def two_cameras(frames: int, skew: float = 0.003) -> FrameFreshness:
    """Exterior and wrist cameras at 15 Hz, the wrist ``skew`` s later (as the bag records them)."""
    f = FrameFreshness()
    for i in range(frames):
        f.arrived("exterior", i * PERIOD)
        f.arrived("wrist", i * PERIOD + skew)
    return f


def test_a_request_due_late_in_a_frame_waits_and_one_due_early_does_not():
    f = two_cameras(5)
    last = 4 * PERIOD
    assert not f.should_wait(last + 0.010, due_since=last + 0.010)  # both frames ~10 ms old
    assert f.should_wait(last + 0.050, due_since=last + 0.050)  # 50 of 67 ms: the next is 17 ms away
    f.arrived("exterior", 5 * PERIOD)  # the one it waited for...
    assert f.should_wait(5 * PERIOD + 0.001, due_since=last + 0.050)  # ...the wrist's is still old
    f.arrived("wrist", 5 * PERIOD + 0.003)
    assert not f.should_wait(5 * PERIOD + 0.004, due_since=last + 0.050)


def test_a_stopped_camera_holds_a_request_at_most_one_period():
    f = two_cameras(5)
    due = 4 * PERIOD + 0.050
    assert f.should_wait(due + 0.9 * PERIOD, due_since=due)
    assert not f.should_wait(due + 1.01 * PERIOD, due_since=due)


def test_without_a_period_yet_nothing_waits():
    f = FrameFreshness()
    f.arrived("exterior", 0.0)
    assert not f.should_wait(10.0, due_since=10.0)
    with pytest.raises(ValueError, match="smoothing"):
        FrameFreshness(smoothing=0.0)


def test_the_period_estimate_follows_the_camera():
    f = two_cameras(40)
    assert f.period["exterior"] == pytest.approx(PERIOD)
    for i in range(40, 80):  # the camera slows to 10 Hz
        f.arrived("exterior", 39 * PERIOD + (i - 39) * 0.1)
    assert f.period["exterior"] == pytest.approx(0.1, rel=1e-3)


def test_the_bench_robots_use_the_same_rule():
    at = [0.0, 0.1, 0.2]
    assert waits_for_next(at, 1, 0.16, 0.1) and not waits_for_next(at, 1, 0.14, 0.1)
    assert not waits_for_next(at, 2, 0.29, 0.1)  # no next observation to wait for
    assert not waits_for_next(at, 1, 0.19, None)  # --frame-policy newest
