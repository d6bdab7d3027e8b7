"""Repeated problems: the first said at once, then once a period with the count; none lost."""

from __future__ import annotations

import pytest

from mstar.report_throttle import ReportThrottle


def test_first_at_once_then_a_count_per_period():
    t = ReportThrottle(5.0)
    assert t.report("bad", "frame bad", 0.0) == "frame bad"
    assert [t.report("bad", "frame bad", 0.01 * i) for i in range(1, 100)] == [None] * 99
    assert t.report("bad", "frame bad", 5.0) == "frame bad (99 more like this in the last 5.0 s)"
    assert t.report("bad", "frame bad", 5.1) is None


def test_kinds_are_apart():
    t = ReportThrottle(5.0)
    assert t.report(("bad", "a"), "a", 0.0) == "a"
    assert t.report(("bad", "b"), "b", 0.1) == "b"  # another problem is said at once


def test_flush_says_the_repeats_when_they_stop():
    t = ReportThrottle(5.0)
    t.report("k", "x", 0.0)
    for i in range(1, 4):
        t.report("k", f"x{i}", i * 0.1)
    assert t.flush(1.0) == []  # within the period: nothing yet
    assert t.flush(5.0) == [("k", "x3 (2 more like this in the last 5.0 s)")]  # the last one, and two before it
    assert t.flush(20.0) == []  # nothing left: nothing said twice


def test_no_period_says_everything():
    t = ReportThrottle(0.0)
    assert [t.report("k", "x", float(i)) for i in range(3)] == ["x", "x", "x"]
    with pytest.raises(ValueError):
        ReportThrottle(-1)


def test_a_forced_flush_says_pending_repeats_before_their_period_ends():
    t = ReportThrottle(5.0)
    t.report("k", "x", 0.0)
    t.report("k", "x1", 1.0)
    assert t.flush(2.0) == []
    assert t.flush(2.0, force=True) == [("k", "x1")]  # stopping: said now, not lost
    assert t.flush(9.0, force=True) == []
