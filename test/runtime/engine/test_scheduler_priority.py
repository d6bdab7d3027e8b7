"""Scheduler by priority class: a more urgent class is scheduled and kept first; classes off: arrival order."""

from __future__ import annotations

import itertools

from mstar.engine.block_manager import BlockManager, BlockTable
from mstar.engine.config import EngineConfig
from mstar.engine.kv_cache import KVSpec, PagedKVCache
from mstar.engine.messages import ExecuteNode
from mstar.engine.scheduler import Scheduler
from mstar.engine.sequence import ActiveCall, SeqStatus, Sequence
from mstar.priority import Priority
from mstar.sampling_params import SamplingParams

_clock = itertools.count()
C, IA, B = Priority.CONTROL, Priority.INTERACTIVE, Priority.BATCH


def make_scheduler(num_blocks=32, block_size=4, period=1, **cfg) -> Scheduler:
    config = EngineConfig(num_kv_blocks=num_blocks, block_size=block_size, **cfg)
    return Scheduler(
        BlockManager(num_blocks, block_size), PagedKVCache(KVSpec(1, 1, 2), num_blocks, block_size), config, period
    )


def add_seq(sched: Scheduler, name: str, num_tokens: int, priority: Priority) -> Sequence:
    seq = Sequence(
        owner=name,
        node="llm",
        request_id=name,
        table=BlockTable(blocks=[]),
        token_ids=list(range(1, num_tokens + 1)),
        arrival=float(next(_clock)),
    )
    msg = ExecuteNode(call_id=0, request_id=name, node="llm", inputs={}, sampling=SamplingParams(), priority=priority)
    seq.call = ActiveCall(msg, lambda out: None)
    sched.seqs[seq.key] = seq
    return seq


def run_step(sched: Scheduler) -> list[tuple[str, int, int]]:
    batch = sched.schedule()
    sched.complete(batch)
    return [(item.seq.owner, item.start, item.num_tokens) for item in batch]


def test_a_younger_control_sequence_takes_the_budget_before_older_batch_ones():
    s = make_scheduler(max_batched_tokens=8)
    add_seq(s, "batch", 6, B)
    add_seq(s, "voice", 4, IA)
    add_seq(s, "control", 5, C)
    assert s.most_urgent() == C
    assert run_step(s) == [("control", 0, 5), ("voice", 0, 3)]
    assert run_step(s) == [("voice", 3, 1), ("batch", 0, 6)]


def test_classes_off_keeps_arrival_order():
    s = make_scheduler(max_batched_tokens=8, priority_classes=False)
    add_seq(s, "batch", 6, B)
    add_seq(s, "voice", 4, IA)
    add_seq(s, "control", 5, C)
    assert s.most_urgent() == IA  # every call is one class
    assert run_step(s) == [("batch", 0, 6), ("voice", 0, 2)]


def test_preemption_takes_the_least_urgent_class_first_even_if_older():
    s = make_scheduler(num_blocks=4, block_size=4)
    old_batch = add_seq(s, "batch", 4, B)
    voice = add_seq(s, "voice", 4, IA)
    run_step(s)
    run_step(s)
    assert old_batch.table.blocks and voice.table.blocks
    control = add_seq(s, "control", 12, C)  # needs 3 of the 4 blocks: one holder must go
    assert s.make_room(control, 12, [])
    assert old_batch.status == SeqStatus.WAITING and not old_batch.table.blocks
    assert voice.table.blocks  # the younger voice sequence keeps its KV: its class is more urgent
    assert s.num_preemptions == 1


def test_a_more_urgent_running_sequence_is_never_preempted_for_a_less_urgent_one():
    s = make_scheduler(num_blocks=2, block_size=4)
    control = add_seq(s, "control", 8, C)
    run_step(s)
    assert len(control.table.blocks) == 2
    batch = add_seq(s, "batch", 4, B)
    assert run_step(s) == []  # no room, and the control sequence keeps its KV
    assert control.table.blocks and control.status == SeqStatus.RUNNING
    assert batch.num_computed == 0


def test_classes_off_never_preempts_an_older_sequence_whatever_its_class():
    s = make_scheduler(num_blocks=4, block_size=4, priority_classes=False)
    batch = add_seq(s, "batch", 4, B)
    voice = add_seq(s, "voice", 4, IA)
    run_step(s)
    control = add_seq(s, "control", 12, C)
    assert not s.make_room(control, 12, [])  # the youngest: it waits, as before classes
    assert batch.table.blocks and voice.table.blocks and s.num_preemptions == 0


def test_a_control_sequence_is_not_held_back_for_phase():
    s = make_scheduler(period=7, max_batched_tokens=64)
    for name in ("a", "b"):
        add_seq(s, name, 3, IA)
    run_step(s)  # both decoding, in phase 0
    for seq in s.seqs.values():
        seq.token_ids.append(9)
        seq.num_generated = 1
    late_voice = add_seq(s, "voice", 3, IA)
    control = add_seq(s, "control", 3, C)
    owners = [owner for owner, _, _ in run_step(s)]
    assert "control" in owners and "voice" not in owners
    assert late_voice.phase_waits == 1 and control.phase_waits == 0
