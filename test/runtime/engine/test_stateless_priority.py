"""The stateless engine by priority class: a batch takes the more urgent calls first, and a control
call is due at once instead of waiting to be batched; classes off: first chunks, then arrival."""

from __future__ import annotations

import torch

from mstar.engine.messages import ExecuteNode
from mstar.engine.stateless_engine import StatelessEngine
from mstar.priority import Priority
from mstar.transport.inprocess import InProcessTensorStore
from support.toy_models import Scale


def engine_with_calls(calls: list[tuple[str, int, Priority]], classes: bool) -> StatelessEngine:
    """An engine holding one call of ``scale`` per (request, index, class), in that arrival order."""
    store = InProcessTensorStore()
    engine = StatelessEngine({"scale": Scale()}, store, max_batch=2, max_wait_s=60.0, priority_classes=classes)
    for request, index, cls in calls:
        x = store.put(torch.ones(1), owner=request)
        msg = ExecuteNode(call_id=0, request_id=request, node="scale", inputs={"x": x}, index=index, priority=cls)
        engine._handle(msg, lambda out: None)
    return engine


CALLS = [
    ("img1", 0, Priority.BATCH),
    ("img2", 0, Priority.BATCH),
    ("ctl", 3, Priority.CONTROL),
    ("voice", 5, Priority.INTERACTIVE),
]


def test_a_batch_takes_the_most_urgent_calls_first():
    engine = engine_with_calls(CALLS, classes=True)
    assert engine.most_urgent() == Priority.CONTROL
    assert [p.msg.request_id for p in engine._next_batch()] == ["ctl", "voice"]
    assert [p.msg.request_id for p in engine._next_batch()] == ["img1", "img2"]


def test_classes_off_keeps_first_chunks_then_arrival():
    engine = engine_with_calls(CALLS, classes=False)
    assert [p.msg.request_id for p in engine._next_batch()] == ["img1", "img2"]
    assert [p.msg.request_id for p in engine._next_batch()] == ["ctl", "voice"]


def test_a_later_chunk_of_a_control_call_does_not_wait_to_be_batched():
    later = [("ctl", 3, Priority.CONTROL)]
    assert engine_with_calls(later, classes=True).has_work()
    assert not engine_with_calls(later, classes=False).has_work()  # it may wait max_wait_s for company
