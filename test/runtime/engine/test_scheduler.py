"""Scheduler unit tests: token budget, oldest-first order, chunked prefill, preemption, eviction."""

from __future__ import annotations

import itertools

from mstar.engine.block_manager import BlockManager, BlockTable
from mstar.engine.config import EngineConfig
from mstar.engine.kv_cache import KVSpec, PagedKVCache
from mstar.engine.messages import ExecuteNode
from mstar.engine.scheduler import Scheduler
from mstar.engine.sequence import ActiveCall, SeqStatus, Sequence
from mstar.sampling_params import SamplingParams

_clock = itertools.count()


def make_scheduler(num_blocks=16, block_size=4, period=1, **cfg) -> Scheduler:
    config = EngineConfig(num_kv_blocks=num_blocks, block_size=block_size, **cfg)
    blocks = BlockManager(num_blocks, block_size)
    cache = PagedKVCache(KVSpec(1, 1, 2), num_blocks, block_size)
    return Scheduler(blocks, cache, config, period=period)


def add_seq(sched: Scheduler, name: str, num_tokens: int, *, with_call: bool = True, kv_window=None) -> Sequence:
    """A sequence with ``num_tokens`` pending tokens; arrival order = creation order."""
    seq = Sequence(
        owner=name,
        node="llm",
        request_id=name,
        table=BlockTable(blocks=[]),
        token_ids=list(range(1, num_tokens + 1)),
        arrival=float(next(_clock)),
        kv_window=kv_window,
    )
    if with_call:
        msg = ExecuteNode(call_id=0, request_id=name, node="llm", inputs={}, sampling=SamplingParams())
        seq.call = ActiveCall(msg, lambda out: None)
    sched.seqs[seq.key] = seq
    return seq


def run_step(sched: Scheduler):
    batch = sched.schedule()
    sched.complete(batch)
    return [(item.seq.owner, item.start, item.num_tokens) for item in batch]


def test_budget_is_shared_oldest_first_and_prefill_is_chunked():
    s = make_scheduler(num_blocks=32, max_batched_tokens=8)
    a = add_seq(s, "a", 5)
    b = add_seq(s, "b", 7)
    c = add_seq(s, "c", 3)
    assert s.has_work()
    # a (oldest) takes 5, b gets the remaining 3 of the budget, c waits
    assert run_step(s) == [("a", 0, 5), ("b", 0, 3)]
    assert a.num_computed == 5 and b.num_computed == 3 and c.num_computed == 0
    assert a.num_pending == 0
    # a has nothing pending now: b continues its prefill from token 3, c gets the rest
    assert run_step(s) == [("b", 3, 4), ("c", 0, 3)]
    assert not s.has_work()
    # every scheduled token got a KV slot
    for seq in (a, b, c):
        assert seq.table.num_tokens == len(seq.token_ids)
        assert len(seq.table.blocks) == -(-len(seq.token_ids) // 4)


def test_decode_and_prefill_share_a_step():
    s = make_scheduler(num_blocks=32, max_batched_tokens=6)
    a = add_seq(s, "a", 4)
    run_step(s)
    a.token_ids.append(50)  # a decode token
    add_seq(s, "b", 20)
    assert run_step(s) == [("a", 4, 1), ("b", 0, 5)]
    a.token_ids.append(51)
    assert run_step(s) == [("a", 5, 1), ("b", 5, 5)]


def test_max_num_seqs_caps_the_batch():
    s = make_scheduler(num_blocks=32, max_num_seqs=2)
    for name in "abcd":
        add_seq(s, name, 2)
    assert [o for o, _, _ in run_step(s)] == ["a", "b"]
    assert [o for o, _, _ in run_step(s)] == ["c", "d"]


def test_sequences_without_a_call_are_not_scheduled():
    s = make_scheduler()
    add_seq(s, "a", 4, with_call=False)
    assert not s.has_work()
    assert s.schedule() == []


def test_youngest_running_sequence_is_preempted_and_recomputed():
    s = make_scheduler(num_blocks=4, block_size=4)
    a = add_seq(s, "a", 4)  # 1 block
    b = add_seq(s, "b", 8)  # 2 blocks
    c = add_seq(s, "c", 4)  # 1 block
    run_step(s)
    assert s.blocks.num_free_blocks == 0 and s.num_preemptions == 0
    a.token_ids.append(9)  # a needs a new block: the youngest holder (c) goes
    assert run_step(s) == [("a", 4, 1)]
    assert s.num_preemptions == 1
    assert c.table.blocks == [] and c.num_computed == 0 and c.status == SeqStatus.WAITING
    assert c.num_pending == 4  # its tokens are kept for recompute
    assert b.num_computed == 8 and len(b.table.blocks) == 2
    s.blocks.free(a.table)  # make room again: c is recomputed from its first token
    a.call = None
    assert run_step(s) == [("c", 0, 4)]


def test_idle_sequences_are_preempted_before_running_ones():
    s = make_scheduler(num_blocks=4, block_size=4)
    a = add_seq(s, "a", 4)
    b = add_seq(s, "b", 4)
    c = add_seq(s, "c", 4)
    d = add_seq(s, "d", 4)
    run_step(s)
    b.call, b.status = None, SeqStatus.IDLE  # b finished a call and holds its KV
    a.token_ids.append(1)
    run_step(s)
    assert b.table.blocks == [] and s.num_preemptions == 1
    assert c.table.blocks and d.table.blocks  # d is younger, but idle b went first


def test_an_older_running_sequence_is_never_preempted_for_a_younger_one():
    s = make_scheduler(num_blocks=3, block_size=4)
    a = add_seq(s, "a", 8)
    run_step(s)
    b = add_seq(s, "b", 8)  # needs 2 blocks, 1 free; a is older and must not be preempted
    assert run_step(s) == []
    assert s.num_preemptions == 0 and a.num_computed == 8 and b.table.blocks == []
    assert b.num_pending == 8


def test_first_come_first_served_when_the_oldest_waits():
    s = make_scheduler(num_blocks=3, block_size=4)
    a = add_seq(s, "a", 8)
    run_step(s)
    big = add_seq(s, "big", 8)  # does not fit next to a
    small = add_seq(s, "small", 2)  # would fit, but queues behind big
    assert run_step(s) == []
    assert small.table.blocks == [] and big.table.blocks == []
    a.call = None
    s.drop(a)
    assert [o for o, _, _ in run_step(s)] == ["big", "small"]


def test_older_idle_sequence_can_be_preempted_for_a_newer_request():
    """An idle sequence (a session between messages, or a request between Walks) holds KV but
    has no call; a newer request that needs the blocks must be able to take them, else it
    waits forever although the admission check accepted it (see the session starvation test
    in test_conductor.py)."""
    s = make_scheduler(num_blocks=4, block_size=4)
    idle = add_seq(s, "session", 12)
    run_step(s)
    idle.call, idle.status = None, SeqStatus.IDLE
    add_seq(s, "new", 8)  # arrives later; needs 2 blocks, 1 free
    assert run_step(s) == [("new", 0, 8)]
    assert idle.table.blocks == [] and idle.num_pending == 12  # recomputed on its next message


def test_complete_with_window_evicts_whole_front_blocks():
    s = make_scheduler(num_blocks=16, block_size=4)
    a = add_seq(s, "a", 10, kv_window=6)
    run_step(s)
    # 10 tokens, window 6: one block (4 tokens) evicted leaves 6 >= window
    assert a.table.first_position == 4
    assert a.table.num_tokens == 6 and len(a.table.blocks) == 2
    assert a.num_computed == 6 and a.token_ids == [5, 6, 7, 8, 9, 10]
    for t in range(30):
        a.token_ids.append(t)
        run_step(s)
        assert 6 <= a.table.num_tokens < 6 + 4
        assert len(a.table.blocks) <= 3
    assert a.table.first_position + a.table.num_tokens == 40
    assert s.blocks.num_used_blocks == len(a.table.blocks)


def test_drop_frees_blocks():
    s = make_scheduler(num_blocks=8)
    a = add_seq(s, "a", 9)
    run_step(s)
    assert s.blocks.num_used_blocks == 3
    s.drop(a)
    assert s.blocks.num_used_blocks == 0 and a.key not in s.seqs
    s.blocks.assert_all_free()


def _decode_step(sched: Scheduler, seqs: list[Sequence], advance: bool = True):
    """One step; every sequence that computed all its tokens then samples one (its next
    input), as the AR engine does."""
    scheduled = run_step(sched)
    for seq in seqs:
        if seq.num_computed and seq.num_pending == 0:
            seq.num_generated += advance
            seq.token_ids.append(0)
    return scheduled


def test_a_new_sequence_starts_in_the_running_sequences_phase():
    s = make_scheduler(num_blocks=64, period=7)
    a = add_seq(s, "a", 3)
    assert run_step(s) == [("a", 0, 3)]  # nothing running yet: no waiting
    a.num_generated = 3
    a.token_ids.append(0)
    b = add_seq(s, "b", 5)  # fresh: samples its first token (phase 0) in the step it is prefilled
    held = 0
    while True:
        phase = a.num_generated % 7
        scheduled = _decode_step(s, [a, b])
        if ("b", 0, 5) in scheduled:
            break
        held += 1
        assert scheduled == [("a", len(a.token_ids) - 2, 1)]
    assert held == 4 and phase == 0  # phases 3, 4, 5, 6 went by; b started with a at phase 0
    assert s.phase_waits == 4 and b.phase_waits == 0
    assert (a.num_generated - b.num_generated) % 7 == 0  # in step from now on


def test_phase_waits_are_bounded_and_off_without_a_period():
    s = make_scheduler(num_blocks=64, period=7)
    a = add_seq(s, "a", 2)
    run_step(s)
    a.num_generated, a.token_ids = 3, a.token_ids + [0]
    b = add_seq(s, "b", 4)
    steps = 0
    while b.num_computed == 0:  # a's phase never comes round: b waits period - 1 steps, then starts
        _decode_step(s, [a, b], advance=False)
        steps += 1
    assert steps == 7 and s.phase_waits == 6
    for period in (1, 7):
        s = make_scheduler(num_blocks=64, period=period)
        a = add_seq(s, "a", 2)
        run_step(s)
        a.num_generated, a.token_ids = 3, a.token_ids + [0]
        add_seq(s, "b", 4)
        add_seq(s, "c", 4).num_generated = 3  # resumed after preemption, already in a's phase
        assert [name for name, _, _ in run_step(s)] == (["a", "b", "c"] if period == 1 else ["a", "c"])


def test_an_over_budget_span_waits_one_step_for_an_older_prefill_chunk():
    """A 12-token span (budget 8) behind an older session's prefill chunk: it is due, and the next
    step is its own: decodes run beside it, the older session's next prompt waits one step."""
    s = make_scheduler(num_blocks=32, max_batched_tokens=8)
    decoding = add_seq(s, "decoding", 4)
    run_step(s)
    decoding.token_ids.append(50)
    session = add_seq(s, "session", 6)
    image = add_seq(s, "image", 12)
    image.spans = [(0, 12)]
    assert run_step(s) == [("decoding", 4, 1), ("session", 0, 6)]
    decoding.token_ids.append(51)
    session.token_ids.extend([60, 61, 62])  # its next turn
    assert run_step(s) == [("decoding", 5, 1), ("image", 0, 12)]
    decoding.token_ids.append(52)
    image.token_ids.append(70)
    assert run_step(s) == [("decoding", 6, 1), ("session", 6, 3), ("image", 12, 1)]


def test_an_over_budget_span_runs_at_once_beside_decodes_only():
    """Older and younger decodes run beside the span (10 tokens, budget 4); a younger prompt waits."""
    s = make_scheduler(num_blocks=32, max_batched_tokens=4)
    older, younger = add_seq(s, "older", 2), add_seq(s, "younger", 2)
    run_step(s)
    image = add_seq(s, "image", 10)
    image.spans = [(0, 10)]
    younger.arrival = image.arrival + 0.5
    add_seq(s, "late", 3)
    older.token_ids.append(7)
    younger.token_ids.append(8)
    assert run_step(s) == [("older", 2, 1), ("image", 0, 10), ("younger", 2, 1)]
    assert run_step(s) == [("late", 0, 3)]
