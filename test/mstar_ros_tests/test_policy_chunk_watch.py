"""When a robot's policy cannot produce chunks: a Worker down, a chunk overdue; an outage until a chunk."""

from __future__ import annotations

import pytest

from mstar_ros.policy.chunk_watch import ChunkWatch


def test_a_worker_down_or_an_overdue_chunk_is_a_problem():
    w = ChunkWatch(timeout_s=2.0)
    assert w.problem(10.0, None, None) is None  # nothing in flight, every Worker up
    assert w.problem(10.0, None, requested_at=8.5) is None  # in flight 1.5 s: not yet overdue
    assert w.problem(10.0, None, requested_at=7.5) == "chunk overdue: requested 2.5 s ago (chunk_timeout_s=2)"
    said = w.problem(10.0, "worker rank 1 restarting: died (killed by SIGKILL)", requested_at=9.9)
    assert said == "no policy: worker rank 1 restarting: died (killed by SIGKILL)"


def test_an_outage_starts_once_and_ends_with_a_chunk():
    w = ChunkWatch(timeout_s=2.0)
    assert w.end(5.0) is None and not w.active  # a chunk without an outage
    assert w.begin(10.0, "no policy: worker rank 1 starting") is True and w.active
    assert w.begin(11.0, "chunk failed: boom") is False and w.why == "chunk failed: boom"  # the same outage
    assert w.end(13.5) == pytest.approx(3.5) and not w.active
    assert w.begin(20.0, "chunk overdue") is True  # a new one


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        ChunkWatch(0.0)
