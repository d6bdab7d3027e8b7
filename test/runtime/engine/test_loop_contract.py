"""The AR engine's loop contract: every loop keeps it, the engine dispatches on the call's mode alone."""

from __future__ import annotations

import msgspec
import pytest
import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.config import EngineConfig
from mstar.engine.flow_loop import FlowLoop
from mstar.engine.frame_loop import FrameLoop
from mstar.engine.loop_contract import EngineLoop
from mstar.engine.messages import CloseSession, ExecuteNode, NodeOutput, ReleaseRequest
from mstar.engine.token_loop import TokenLoop
from mstar.graph import GraphNode, LoopMode
from mstar.priority import Priority
from mstar.transport.inprocess import InProcessTensorStore
from support.toy_models import ToyLM

CONTRACT = ("start", "has_work", "step", "fail_all", "release", "close_session", "stats")


class Recorder(EngineLoop):
    """A loop that records what the engine hands it."""

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.fail_with = fail_with

    def start(self, msg, reply) -> None:
        self.calls.append(("start", msg.call_id))

    def has_work(self) -> bool:
        return self.fail_with is not None

    def step(self, limit=None) -> int:
        if self.fail_with is not None:
            raise self.fail_with
        return 0

    def fail_all(self, error: Exception) -> None:
        self.calls.append(("fail_all", error))
        self.fail_with = None

    def release(self, request_id: str) -> None:
        self.calls.append(("release", request_id))

    def close_session(self, session_id: str) -> None:
        self.calls.append(("close_session", session_id))

    def stats(self) -> dict[str, int]:
        return {}


class ClassedRecorder(Recorder):
    """A loop with due work of one class that records the limit of each step it takes."""

    def __init__(self, urgent: Priority) -> None:
        super().__init__()
        self.urgent = urgent

    def has_work(self) -> bool:
        return True

    def most_urgent(self) -> Priority | None:
        return self.urgent

    def step(self, limit=None) -> int:
        self.calls.append(("step", limit))
        return 1


def _engine() -> tuple[AREngine, InProcessTensorStore]:
    store = InProcessTensorStore()
    return AREngine(ToyLM(), ["llm"], store, EngineConfig(num_kv_blocks=16, block_size=4)), store


def _call(store: InProcessTensorStore, call_id: int, mode) -> ExecuteNode:
    ids = store.put(torch.tensor([1, 2, 3]), owner="r")
    return ExecuteNode(call_id=call_id, request_id="r", node="llm", inputs={"input_ids": ids}, loop_mode=mode)


def test_the_contract_names_the_methods_every_loop_defines():
    assert EngineLoop.__abstractmethods__ == frozenset(CONTRACT)
    for loop in (TokenLoop, FlowLoop, FrameLoop):
        assert issubclass(loop, EngineLoop) and not loop.__abstractmethods__
        assert [m for m in CONTRACT if m not in vars(loop)] == [], loop.__name__


def test_the_engine_holds_one_loop_per_mode():
    engine, _ = _engine()
    assert set(engine.loops) == set(LoopMode)
    kinds = {mode: type(loop) for mode, loop in engine.loops.items()}
    assert kinds == {
        LoopMode.TOKEN: TokenLoop,
        LoopMode.FLOW: FlowLoop,
        LoopMode.VELOCITY: FlowLoop,
        LoopMode.FRAMES: FrameLoop,
    }
    assert engine.loops[LoopMode.VELOCITY] is engine.loops[LoopMode.FLOW]  # one loop, stepped once


def test_a_call_goes_to_the_loop_of_its_mode_and_the_rest_to_every_loop():
    engine, store = _engine()
    recorders = {mode: Recorder() for mode in LoopMode}
    engine.loops = dict(recorders)
    replies: list[NodeOutput] = []
    for call_id, mode in enumerate(LoopMode):
        engine._handle(_call(store, call_id, mode), replies.append)
    engine._handle(ReleaseRequest("r"))
    engine._handle(CloseSession("s"))
    assert not replies
    for call_id, mode in enumerate(LoopMode):
        assert recorders[mode].calls == [("start", call_id), ("release", "r"), ("close_session", "s")]


def test_an_unknown_mode_fails_the_call_with_a_clear_error():
    engine, store = _engine()
    replies: list[NodeOutput] = []
    engine._handle(_call(store, 1, "bogus"), replies.append)
    assert replies[-1].final and replies[-1].error == (
        "node 'llm': engine 'ar' runs no loop of mode 'bogus' (it runs ['flow', 'velocity', 'frames', 'token'])"
    )
    del engine.loops[LoopMode.FLOW]  # an engine without a loop for a valid mode says so too
    engine._handle(_call(store, 2, LoopMode.FLOW), replies.append)
    assert "runs no loop of mode <LoopMode.FLOW: 'flow'>" in replies[-1].error
    with pytest.raises(
        ValueError, match=r"unknown loop mode 'bogus': one of \['token', 'flow', 'frames', 'velocity'\]"
    ):
        GraphNode("n", ("a",), ("b",), engine="ar", loop_mode="bogus")
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(
            msgspec.msgpack.encode(
                {
                    "type": "ExecuteNode",
                    "call_id": 1,
                    "request_id": "r",
                    "node": "n",
                    "inputs": {},
                    "loop_mode": "bogus",
                }
            ),
            type=ExecuteNode,
        )


def test_the_mode_travels_on_the_wire_and_a_declaration_may_spell_it():
    msg = ExecuteNode(call_id=1, request_id="r", node="n", inputs={}, loop_mode=LoopMode.FRAMES)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=ExecuteNode)
    assert back.loop_mode is LoopMode.FRAMES
    assert ExecuteNode(call_id=1, request_id="r", node="n", inputs={}).loop_mode is LoopMode.TOKEN
    node = GraphNode("n", ("x",), ("x",), engine="ar", kv_from="p", loop_mode="flow")
    assert node.loop_mode is LoopMode.FLOW


def test_a_failing_step_goes_to_its_loops_fail_all_and_the_others_still_step():
    engine, store = _engine()
    boom = RuntimeError("boom")
    failing = Recorder(fail_with=boom)
    engine.loops[LoopMode.FLOW] = failing
    replies: list[NodeOutput] = []
    engine._handle(_call(store, 1, LoopMode.TOKEN), replies.append)
    engine.step()
    assert failing.calls == [("fail_all", boom)]
    while engine.has_work():
        engine.step()
    assert replies[-1].final and replies[-1].error is None


def test_a_limited_step_leaves_less_urgent_loops_for_their_own_round():
    engine, _ = _engine()
    decode, flow = ClassedRecorder(Priority.INTERACTIVE), ClassedRecorder(Priority.BATCH)
    engine.loops = {LoopMode.FLOW: flow, LoopMode.TOKEN: decode}
    assert engine.due_classes() == {Priority.INTERACTIVE, Priority.BATCH}
    engine.step(Priority.INTERACTIVE)
    assert decode.calls == [("step", Priority.INTERACTIVE)] and flow.calls == []
    engine.step(Priority.BATCH)  # the guard's step of the skipped class (or a batch round)
    assert flow.calls == [("step", Priority.BATCH)]
    engine.step()  # no limit (classes off): every loop steps, as before
    assert flow.calls[-1] == ("step", None) and decode.calls[-1] == ("step", None)
