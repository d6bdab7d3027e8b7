"""Bidirectional spans: the mask, chunked prefill that never splits a span, recompute, fork, handoff."""

from __future__ import annotations

import re

import pytest
import torch

from mstar.engine.attention.flashinfer_backend import FlashInferAttentionBackend
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.torch_backend import build_mask
from mstar.engine.kv_cache import KVSpec, PagedKVCache
from mstar.engine.kv_handoff import export_sequence
from mstar.engine.messages import ExportKV, LoopSpec
from mstar.sampling_params import SamplingParams
from support.attention_cases import positions_mask, run_case
from support.engine_stepper import EngineStepper
from support.toy_row_models import RowKindsLM

LM = RowKindsLM()
IDS = [5, 17, 3, 44, 9, 61, 2, 8, 30, 71, 12, 6, 50, 33]
SPANS = [[2, 7], [9, 13]]


def check(hidden, ref):
    torch.testing.assert_close(hidden, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "spec",
    [
        {"ctx": 14, "ql": 14, "spans": ((2, 7), (9, 13))},  # whole prefill
        {"ctx": 15, "ql": 6, "spans": ((10, 15),)},  # a chunk that is one span after cached keys
        {"ctx": 14, "ql": 5, "first": 8, "spans": ((18, 22),), "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": 12},
    ],
)
def test_paged_attention_with_spans_equals_the_dense_mask(spec):
    out, ref = run_case([spec, {"ctx": 9, "ql": 1}])
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    plain, _ = run_case([{**spec, "spans": ()}, {"ctx": 9, "ql": 1}])
    assert not torch.allclose(out, plain, atol=1e-3)  # the spans changed what the rows saw


def test_flashinfer_custom_mask_holds_the_spans():
    """FlashInfer's plan (no CUDA needed to build it) sends every sequence's mask with the spans."""
    cache = PagedKVCache(KVSpec(1, 1, 8), 8, 4, torch.float32, "cpu")
    backend = object.__new__(FlashInferAttentionBackend)
    backend.cache = cache
    seqs = [
        SeqAttention(0, 6, 9, [0, 1, 2], spans=((4, 8),)),
        SeqAttention(6, 3, 3, [3], spans=()),
    ]
    backend.plan(AttentionMetadata(seqs, torch.arange(9)))
    expected = torch.cat(
        [positions_mask(0, 9, 6, MaskKind.CAUSAL, 0, ((4, 8),)).flatten(), torch.ones(3, 3).tril().bool().flatten()]
    )
    assert torch.equal(backend._step.custom_mask, expected)
    assert torch.equal(build_mask(seqs[0]), positions_mask(0, 9, 6, MaskKind.CAUSAL, 0, ((4, 8),)))


def prefill(st: EngineStepper, rid: str, ids, spans=None, node="llm", session=None, **kw):
    inputs = {"input_ids": torch.tensor(ids)}
    if spans is not None:
        inputs["spans"] = torch.tensor(spans, dtype=torch.long)
    return st.call(node, rid, inputs, session_id=session, **kw)


def test_a_call_with_spans_equals_the_dense_reference():
    st = EngineStepper(LM, ["llm"])
    replies = prefill(st, "r", IDS, SPANS)
    st.drain()
    check(st.output(replies, "hidden")[: len(IDS)], LM.reference_hidden(IDS, SPANS))
    assert not torch.allclose(LM.reference_hidden(IDS, SPANS), LM.reference_hidden(IDS), atol=1e-3)


@pytest.mark.parametrize("budget", [3, 4, 5])
def test_chunked_prefill_never_splits_a_span(budget):
    st = EngineStepper(LM, ["llm"], max_batched_tokens=budget)
    replies = prefill(st, "r", IDS, SPANS)
    steps = st.drain()
    assert steps > 2  # really chunked
    check(st.output(replies, "hidden")[: len(IDS)], LM.reference_hidden(IDS, SPANS))


def test_recompute_after_preemption_keeps_the_spans():
    st = EngineStepper(LM, ["llm"])
    first = prefill(st, "r1", IDS[:8], [[2, 7]], session="s")
    st.drain()
    st.output(first, "hidden")
    seq = st.seq("s", "llm")
    st.engine.scheduler.preempt(seq)  # an older request took the blocks: the session is recomputed
    assert seq.spans == [(2, 7)] and not seq.table.blocks
    second = prefill(st, "r2", IDS[8:], [[1, 5]], session="s")
    st.drain()
    check(st.output(second, "hidden")[: len(IDS)], LM.reference_hidden(IDS, SPANS))


def test_a_fork_of_a_preempted_view_recomputes_with_its_spans():
    st = EngineStepper(LM, ["a", "b"])
    prefill(st, "r", IDS[:8], [[2, 7]], node="a")
    st.drain()
    st.engine.scheduler.preempt(st.seq("r", "a"))
    replies = prefill(st, "r", IDS[8:], [[1, 5]], node="b", kv_from="a")
    st.drain()
    check(st.output(replies, "hidden")[: len(IDS)], LM.reference_hidden(IDS, SPANS))


def test_a_handed_off_sequence_keeps_its_spans():
    sender = EngineStepper(LM, ["llm"])
    prefill(sender, "r", IDS[:8], [[2, 7]])
    sender.drain()
    sender.engine.scheduler.preempt(sender.seq("r", "llm"))  # no KV travels: the receiver recomputes
    state = export_sequence(sender.core, ExportKV(0, "r", "r", "llm")).state
    assert state is not None and state.spans == [(2, 7)]
    receiver = EngineStepper(LM, ["llm"])
    replies = prefill(receiver, "r", IDS[8:], [[1, 5]], kv_import=state)
    receiver.drain()
    check(receiver.output(replies, "hidden")[: len(IDS)], LM.reference_hidden(IDS, SPANS))


@pytest.mark.parametrize(
    "spans, message",
    [
        ([[3, 20]], "outside the call's 14 rows"),
        ([[4, 4]], "outside the call's 14 rows"),
        ([[-1, 2]], "outside"),
        ([[2, 6], [5, 9]], "sorted and disjoint"),
        ([[8, 10], [2, 4]], "sorted and disjoint"),
        ([[1, 2, 3]], r"\[k, 2\]"),
        ([[1.0, 2.0]], "integers"),
    ],
)
def test_bad_spans_fail_naming_spans_and_the_engine_keeps_serving(spans, message):
    st = EngineStepper(LM, ["llm"])
    bad = st.call("llm", "bad", {"input_ids": torch.tensor(IDS), "spans": torch.tensor(spans)})
    assert bad[-1].error is not None and "spans" in bad[-1].error
    assert re.search(message, bad[-1].error), bad[-1].error
    assert ("bad", "llm") not in st.engine.scheduler.seqs  # checked before a sequence was made
    good = prefill(st, "good", IDS, SPANS)
    st.drain()
    check(st.output(good, "hidden")[: len(IDS)], LM.reference_hidden(IDS, SPANS))


def test_a_span_longer_than_the_budget_starts_beside_running_decodes():
    """A 10-row span with a token budget of 4, arriving while two older requests decode, runs within
    two steps (not once they have finished) and is exact; the decodes never stop."""
    st = EngineStepper(LM, ["llm"], max_batched_tokens=4)
    decoders = [
        prefill(st, f"d{i}", IDS[i : i + 3], loop=LoopSpec(max_iters=40), sampling=SamplingParams()) for i in range(2)
    ]
    for _ in range(4):
        st.engine.step()
    replies = prefill(st, "image", IDS, [[2, 12]])
    image = st.seq("image", "llm")
    steps = 0
    while image.num_computed < 12:
        generated = [st.seq(f"d{i}", "llm").num_generated for i in range(2)]
        st.engine.step()
        steps += 1
        assert [st.seq(f"d{i}", "llm").num_generated for i in range(2)] == [g + 1 for g in generated]
    assert steps <= 2
    st.drain()
    check(st.output(replies, "hidden")[: len(IDS)], LM.reference_hidden(IDS, [[2, 12]]))
    assert all(r[-1].final and r[-1].error is None for r in decoders)
