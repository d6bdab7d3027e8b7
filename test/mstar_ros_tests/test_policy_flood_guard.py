"""A topic flooding bad messages is shut, reopened, shut for longer if it goes on; a slow bad camera is not."""

from __future__ import annotations

import pytest

from mstar_ros.policy.flood_guard import FloodGuard


def test_a_flood_trips_then_the_topic_reopens_and_a_continuing_flood_doubles_the_hold():
    g = FloodGuard(max_bad_per_s=100, first_hold_s=5, max_hold_s=60)
    trips = [g.bad("cam", i / 400) for i in range(200)]  # 400 bad frames a second
    assert trips[:25] == [None] * 25 and trips[25] == 5 and g.is_shut("cam")  # 25 in a quarter of a second
    assert all(t is None for t in trips[101:])  # messages still in flight do not trip it again
    g.reopened("cam", 5.3)  # the caller's timer, after the hold
    assert not g.is_shut("cam")
    again = [g.bad("cam", 5.3 + i / 400) for i in range(30)]
    assert [t for t in again if t] == [10]  # the flood went on: twice as long
    g.reopened("cam", 15.3)
    assert [t for t in (g.bad("cam", 15.3 + i / 400) for i in range(30)) if t] == [20]  # still going: 20 s
    now, holds = 35.3, []
    for _ in range(4):  # a flood that never stops: 40, 60, then 60 again (not back to 5)
        g.reopened("cam", now)
        holds += [t for t in (g.bad("cam", now + i / 400) for i in range(30)) if t]
        now += holds[-1] + 0.1
    assert holds == [40, 60, 60, 60]
    g.reopened("cam", now)
    now += 100
    late = [g.bad("cam", now + i / 400) for i in range(30)]
    assert [t for t in late if t] == [5]  # calm for over max_hold_s since it was reopened: starts over


def test_a_misconfigured_camera_is_not_shut_and_zero_means_never():
    g = FloodGuard(max_bad_per_s=100)
    assert all(g.bad("cam", i / 30) is None for i in range(300))  # 30 bad frames a second, for 10 s
    never = FloodGuard(max_bad_per_s=0)
    assert all(never.bad("cam", i / 1000) is None for i in range(5000))
    with pytest.raises(ValueError):
        FloodGuard(max_bad_per_s=10, first_hold_s=0)
