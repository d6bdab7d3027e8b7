"""Row kinds: kept per row on the sequence, packed per step for the module, through recompute, forks,
handoff and the tensor-parallel plan."""

from __future__ import annotations

import msgspec
import pytest
import torch

from mstar.engine.attention.metadata import SeqAttention
from mstar.engine.kv_handoff import export_sequence
from mstar.engine.messages import ExportKV, LoopSpec
from mstar.engine.tp_plan import StepPlan, TPLeader, plan_embeds, plan_metadata
from mstar.sampling_params import SamplingParams
from support.engine_stepper import EngineStepper
from support.toy_models import ToyLM
from support.toy_row_models import RowKindsLM

LM = RowKindsLM()
IDS = [5, 17, 3, 44, 9, 61, 2, 8, 30, 71, 12, 6]
KINDS = [0, 0, 1, 1, 1, 0, 2, 2, 0, 1, 0, 0]


def check(hidden, ref):
    torch.testing.assert_close(hidden, ref, atol=1e-5, rtol=1e-5)


def prefill(st, rid, ids, kinds=None, node="llm", session=None, **kw):
    inputs = {"input_ids": torch.tensor(ids)}
    if kinds is not None:
        inputs["row_kinds"] = torch.tensor(kinds, dtype=torch.long)
    return st.call(node, rid, inputs, session_id=session, **kw)


def test_the_module_gets_each_rows_kind_chunked_or_not():
    ref = LM.reference_hidden(IDS, kinds=KINDS)
    assert not torch.allclose(ref, LM.reference_hidden(IDS), atol=1e-3)  # the kinds matter
    for budget in (64, 5):
        st = EngineStepper(LM, ["llm"], max_batched_tokens=budget)
        replies = prefill(st, "r", IDS, KINDS)
        st.drain()
        check(st.output(replies, "hidden")[: len(IDS)], ref)


def test_kinds_of_batched_sequences_and_later_tokens_are_packed_in_row_order():
    st = EngineStepper(LM, ["llm"])
    LM.kinds_seen.clear()
    a = prefill(st, "a", IDS[:5], KINDS[:5])
    b = prefill(st, "b", IDS[5:9])  # no kinds: all 0
    st.drain()
    assert torch.equal(LM.kinds_seen[0], torch.tensor(KINDS[:5] + [0] * 4))
    check(st.output(a, "hidden")[:5], LM.reference_hidden(IDS[:5], kinds=KINDS[:5]))
    check(st.output(b, "hidden")[:4], LM.reference_hidden(IDS[5:9]))
    # a decode Loop after a prompt with kinds: its fed-back tokens are kind 0
    LM.kinds_seen.clear()
    decode = st.call(
        "llm", "a", {"input_ids": torch.tensor([7])}, loop=LoopSpec(max_iters=3), sampling=SamplingParams()
    )
    st.drain()
    assert decode[-1].final and decode[-1].error is None
    assert len(LM.kinds_seen) == 3 and all(int(k.sum()) == 0 for k in LM.kinds_seen)


def test_recompute_fork_and_handoff_keep_the_kinds():
    ref = LM.reference_hidden(IDS, kinds=KINDS)
    st = EngineStepper(LM, ["a", "b"])
    prefill(st, "r", IDS[:7], KINDS[:7], node="a", session="s")
    st.drain()
    st.engine.scheduler.preempt(st.seq("s", "a"))  # recomputed by the fork below
    fork = prefill(st, "r2", IDS[7:], KINDS[7:], node="b", kv_from="a", session="s")
    st.drain()
    check(st.output(fork, "hidden")[: len(IDS)], ref)
    st.engine.scheduler.preempt(st.seq("s", "b"))
    state = export_sequence(st.core, ExportKV(0, "r2", "s", "b")).state
    assert state is not None and state.row_kinds == KINDS
    receiver = EngineStepper(LM, ["b"])
    replies = prefill(receiver, "r3", [4], [2], node="b", kv_import=state)
    receiver.drain()
    check(receiver.output(replies, "hidden")[: len(IDS) + 1], LM.reference_hidden(IDS + [4], kinds=KINDS + [2]))


@pytest.mark.parametrize(
    "module, kinds, message",
    [
        (ToyLM(), [0, 1, 0], "node 'llm': module ToyLM takes no row_kinds"),
        (LM, [0, 1], "'row_kinds' must be [3]"),
        (LM, [0.0, 1.0, 0.0], "must be integers"),
    ],
)
def test_bad_row_kinds_fail_naming_the_node(module, kinds, message):
    st = EngineStepper(module, ["llm"])
    bad = st.call("llm", "bad", {"input_ids": torch.tensor([1, 2, 3]), "row_kinds": torch.tensor(kinds)})
    assert bad[-1].error is not None and message in bad[-1].error, bad[-1].error
    good = prefill(st, "good", [1, 2, 3])
    st.drain()
    assert good[-1].error is None


class _Recorder:
    """Stands in for a TP group of two: keeps what the leader broadcasts (msgpack round trip)."""

    is_leader, size = True, 2

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def broadcast(self, obj, type):
        self.sent.append(msgspec.msgpack.encode(obj))
        return obj


def test_the_tensor_parallel_plan_carries_kinds_and_spans():
    group = _Recorder()
    leader = TPLeader(group)
    seqs = [SeqAttention(0, 3, 3, [0], spans=((1, 3),))]
    leader.forward_plan([1, 2, 3], [0, 1, 2], seqs, torch.arange(3), row_kinds=torch.tensor([0, 2, 1]))
    plan = msgspec.msgpack.decode(group.sent[-1], type=StepPlan)
    assert torch.equal(plan_embeds(plan, torch.device("cpu"))["row_kinds"], torch.tensor([0, 2, 1]))
    assert plan_metadata(plan, torch.device("cpu")).seqs[0].spans == ((1, 3),)
    leader.forward_plan([1], [0], [SeqAttention(0, 1, 1, [0])], torch.arange(1))
    plan = msgspec.msgpack.decode(group.sent[-1], type=StepPlan)
    assert "row_kinds" not in plan_embeds(plan, torch.device("cpu"))  # a module without kinds gets none
