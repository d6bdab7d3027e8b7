"""CountedLog: every problem counted, the first of a kind logged at once, repeats once per period, none lost."""

from __future__ import annotations

import logging

from mstar.counted_log import CountedLog


def test_counts_every_note_and_logs_each_kind_throttled_at_its_own_level(caplog):
    caplog.set_level(logging.INFO, logger="counted")
    now = [0.0]
    problems = CountedLog(logging.getLogger("counted"), prefix="server x: ", period_s=5.0, clock=lambda: now[0])
    for i in range(10):
        now[0] = i * 0.1
        problems.note("silent", f"peer {i} said nothing", logging.INFO)
    problems.note("unproven", "peer 11 had no token")
    assert problems.counts == {"silent": 10, "unproven": 1}
    assert problems.next_flush_at() == 5.0  # silent's first line was at 0.0
    problems.flush()
    now[0] = 5.0
    problems.flush()
    assert problems.next_flush_at() is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "server x: peer 0 said nothing"),
        (logging.WARNING, "server x: peer 11 had no token"),
        (logging.INFO, "server x: peer 9 said nothing (8 more like this in the last 5.0 s)"),
    ]


def test_a_forced_flush_says_what_is_pending_at_once(caplog):
    caplog.set_level(logging.WARNING, logger="counted")
    problems = CountedLog(logging.getLogger("counted"), period_s=5.0, clock=lambda: 1.0)
    problems.note("k", "a")
    problems.note("k", "b")
    problems.flush(force=True)
    assert [r.getMessage() for r in caplog.records] == ["a", "b"]
