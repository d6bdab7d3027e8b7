"""TorchAttentionBackend against dense attention on contiguous K/V."""

import functools

import pytest
import torch

from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.torch_backend import (
    TorchAttentionBackend,
    batch_key_slots,
    contiguous_key_start,
    key_slots,
)
from mstar.engine.kv_cache import KVSpec, PagedKVCache
from support.attention_cases import BS, run_case


def check(out, ref, atol=1e-5):
    assert out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=atol)


@pytest.mark.parametrize(
    "kind,arg", [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 7), (MaskKind.BLOCK_CAUSAL, 3)]
)
def test_full_prefill_each_mask(kind, arg):
    out, ref = run_case([{"ctx": 13, "ql": 13, "mask": kind, "arg": arg}])
    check(out, ref)


@pytest.mark.parametrize(
    "kind,arg", [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 12), (MaskKind.BLOCK_CAUSAL, 5)]
)
def test_chunked_prefill_each_mask(kind, arg):
    # 6 new tokens on top of 9 cached ones; the prefix / frame boundaries cut through the chunk.
    out, ref = run_case([{"ctx": 15, "ql": 6, "mask": kind, "arg": arg}])
    check(out, ref)


def test_masks_differ():
    """Guard the reference: the three masks really produce different attention here."""
    outs = [
        run_case([{"ctx": 12, "ql": 12, "mask": m, "arg": a}])[0]
        for m, a in [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 6), (MaskKind.BLOCK_CAUSAL, 4)]
    ]
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[0], outs[2])


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])
def test_gqa(hq, hkv):
    out, ref = run_case([{"ctx": 10, "ql": 10}, {"ctx": 9, "ql": 1}, {"ctx": 5, "ql": 1}], hq=hq, hkv=hkv)
    check(out, ref)


def test_mixed_batch_prefill_chunks_and_decodes():
    specs = [
        {"ctx": 17, "ql": 17},  # fresh prefill
        {"ctx": 1, "ql": 1},  # decode, one key
        {"ctx": 22, "ql": 5, "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": 19},  # chunk
        {"ctx": 30, "ql": 1, "mask": MaskKind.BLOCK_CAUSAL, "arg": 4},
        {"ctx": 9, "ql": 1, "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": 20},
    ]
    # Packed rows interleave prefill and decode sequences.
    out, ref = run_case(specs, hq=8, hkv=2, row_order=[1, 0, 3, 2, 4])
    check(out, ref)
    out, ref = run_case(specs, hq=8, hkv=2)
    check(out, ref)


def test_decode_only_batch_of_different_lengths():
    out, ref = run_case([{"ctx": c, "ql": 1} for c in (3, 40, 17, 8, 1)], hq=8, hkv=4)
    check(out, ref)
    out, ref = run_case([{"ctx": 12, "ql": 1} for _ in range(3)], row_order=[2, 0, 1])
    check(out, ref)


@pytest.mark.parametrize(
    "kind,arg", [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 14), (MaskKind.BLOCK_CAUSAL, 6)]
)
def test_first_position_after_eviction(kind, arg):
    # Cached tokens start at absolute position 8 (two blocks evicted): the masks must use
    # absolute positions, e.g. the prefix [0, 14) now covers only table tokens [0, 6).
    out, ref = run_case([{"ctx": 14, "ql": 5, "first": 8, "mask": kind, "arg": arg}, {"ctx": 10, "ql": 1, "first": 4}])
    check(out, ref)


def test_bf16_cache_computes_in_fp32_and_returns_q_dtype():
    specs = [{"ctx": 20, "ql": 6}, {"ctx": 11, "ql": 1}, {"ctx": 3, "ql": 1}]
    out, ref = run_case(specs, hq=4, hkv=2, dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    check(out, ref, atol=2e-2)  # only the output rounding to bf16 remains


def test_plan_validation():
    cache = PagedKVCache(KVSpec(1, 1, 4), 4, BS)
    b = TorchAttentionBackend(cache)
    with pytest.raises(ValueError, match="exceeds"):
        b.plan(AttentionMetadata([SeqAttention(0, 1, 9, [0, 1])], torch.tensor([8])))
    with pytest.raises(ValueError, match="slot_mapping"):
        b.plan(AttentionMetadata([SeqAttention(0, 2, 2, [0])], torch.tensor([0])))
    with pytest.raises(RuntimeError, match="before plan"):
        TorchAttentionBackend(cache).forward(0, torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), 1.0)


@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 1), (4, 4)])
def test_fully_bidirectional_prefill_runs_query_heads_as_rows(hq, hkv):
    """No mask at all (a pi0.5 prefix): the G heads of a KV head run as G x L rows of it."""
    out, ref = run_case([{"ctx": 13, "ql": 13, "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": 13}], hq=hq, hkv=hkv)
    check(out, ref)


@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 1)])
def test_groups_of_equal_query_length(hq, hkv):
    """Sequences with the same query length share one padded call: suffixes that see all their
    keys (flow steps over different prefixes) run heads as rows under a key-padding mask;
    causal ones keep the full per-row mask."""
    alike = [{"ctx": c, "ql": 5, "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": c} for c in (20, 23, 9)]
    out, ref = run_case(alike, hq=hq, hkv=hkv, row_order=[2, 0, 1])
    check(out, ref)
    causal = [{"ctx": c, "ql": 5} for c in (20, 23, 9)]
    out, ref = run_case(causal, hq=hq, hkv=hkv)
    check(out, ref)


def test_heads_as_rows_round_trip_and_plan():
    from mstar.engine.attention.torch_backend import heads_as_rows, rows_as_heads

    q = torch.randn(3, 5, 8, 4)
    rows = heads_as_rows(q, 2)
    assert rows.shape == (3, 2, 4 * 5, 4)
    assert torch.equal(rows[1, 1, 2 * 5 + 3], q[1, 3, 1 * 4 + 2])  # head 6 = KV head 1, group member 2
    assert torch.equal(rows_as_heads(rows, 5), q)
    cache = PagedKVCache(KVSpec(num_layers=1, num_kv_heads=2, head_dim=4), 16, BS)
    backend = TorchAttentionBackend(cache)
    seqs = [
        SeqAttention(0, 3, 7, [0, 1], 0, MaskKind.PREFIX_BIDIRECTIONAL, 7),
        SeqAttention(3, 3, 5, [2, 3], 0, MaskKind.PREFIX_BIDIRECTIONAL, 5),
    ]
    backend.plan(AttentionMetadata(seqs, torch.arange(6)))
    (group,) = backend._groups
    assert group.rows_alike and group.mask.shape == (2, 1, 1, 7)
    assert group.mask[1, 0, 0].tolist() == [True] * 5 + [False] * 2


def _planned(seqs):
    cache = PagedKVCache(KVSpec(num_layers=1, num_kv_heads=2, head_dim=4), 128, BS)
    backend = TorchAttentionBackend(cache)
    backend.plan(AttentionMetadata(seqs, torch.arange(sum(s.query_len for s in seqs))))
    return backend


def test_short_contexts_are_not_padded_to_a_long_one():
    """Guidance branches over contexts of 200, 190 and 9 keys (a no-image branch beside full ones) and
    decodes over 300 and ~10 keys: only similar lengths share a padded call."""
    table = list(range(80))
    spans = lambda ctx: ((ctx - 5, ctx),)  # noqa: E731  (the flow rows see each other)
    branches = [SeqAttention(5 * i, 5, c, table, spans=spans(c)) for i, c in enumerate((200, 190, 9))]
    backend = _planned(branches)
    assert [g.starts.tolist() for g in backend._groups] == [[0, 5]]
    assert backend._groups[0].max_len == 200
    assert [(p.start, p.slots.numel()) for p in backend._prefills] == [(10, 9)]
    decodes = [SeqAttention(i, 1, c, table) for i, c in enumerate((10, 300, 12, 11))]
    backend = _planned(decodes)
    assert sorted((d.batch, d.max_len) for d in backend._decodes) == [(1, 300), (3, 12)]


@pytest.mark.parametrize("row_order", [None, [3, 1, 0, 4, 2, 5, 6]])
def test_mixed_context_lengths_split_into_calls_stay_exact(row_order):
    specs = [
        {"ctx": 120, "ql": 5, "spans": ((115, 120),)},
        {"ctx": 9, "ql": 5, "spans": ((4, 9),)},
        {"ctx": 112, "ql": 5, "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": 110},
        {"ctx": 150, "ql": 1},
        {"ctx": 3, "ql": 1, "mask": MaskKind.BLOCK_CAUSAL, "arg": 2},
        {"ctx": 4, "ql": 1},
        {"ctx": 33, "ql": 33, "spans": ((10, 20),)},
    ]
    out, ref = run_case(specs, hq=8, hkv=2, num_blocks=160, row_order=row_order)
    check(out, ref)


def _lone_decode(blocks: list[int], ctx: int = 21, hq: int = 4, hkv: int = 2, d: int = 8) -> torch.Tensor:
    """One decode query over ``ctx`` keys stored in ``blocks`` (same keys whatever the blocks)."""
    g = torch.Generator().manual_seed(3)
    k, v, q = (
        torch.randn(ctx, hkv, d, generator=g),
        torch.randn(ctx, hkv, d, generator=g),
        torch.randn(1, hq, d, generator=g),
    )
    cache = PagedKVCache(KVSpec(num_layers=1, num_kv_heads=hkv, head_dim=d), 16, BS, dtype=torch.bfloat16)
    slots = torch.tensor([blocks[j // BS] * BS + j % BS for j in range(ctx)])
    cache.write(0, slots[:-1], k[:-1], v[:-1])
    backend = TorchAttentionBackend(cache)
    backend.plan(AttentionMetadata([SeqAttention(0, 1, ctx, blocks)], slots[-1:]))
    return backend.forward(0, q, k[-1:], v[-1:], 0.35)


def test_lone_decode_reads_consecutive_blocks_in_place_with_the_same_result():
    pages = -(-21 // BS)
    consecutive, scattered = list(range(5, 5 + pages)), [11, 2, 7, 14, 9, 4][:pages]
    assert contiguous_key_start(SeqAttention(0, 1, 21, consecutive), BS) == 5 * BS
    assert contiguous_key_start(SeqAttention(0, 1, 21, scattered), BS) is None
    assert torch.equal(_lone_decode(consecutive), _lone_decode(scattered))  # bitwise: the same keys and math


def test_batch_key_slots_are_each_sequences_key_slots():
    seqs = [
        SeqAttention(0, 1, 21, [11, 2, 7, 14, 9, 4, 3]),  # more blocks than its keys need
        SeqAttention(1, 1, 5, [8, 1]),
        SeqAttention(2, 1, 1, [6]),
    ]
    expected = torch.cat([key_slots(s, BS, 21) for s in seqs])
    assert torch.equal(batch_key_slots(seqs, BS, 21), expected)


@pytest.mark.parametrize("scores", [torch.float32, torch.bfloat16])
def test_a_bf16_cache_attends_within_bf16_rounding_whatever_the_score_dtype(scores, monkeypatch):
    """A bf16 cache's scores run in fp32, or in bf16 where the CPU has AMX (cpu_score_dtype): both
    within bf16's rounding of the fp64 reference (measured 0.0039 and 0.0053 of values up to 2.1)."""
    specs = [
        {"ctx": 120, "ql": 5, "spans": ((115, 120),)},
        {"ctx": 112, "ql": 5, "mask": MaskKind.PREFIX_BIDIRECTIONAL, "arg": 110},
        {"ctx": 150, "ql": 1},
        {"ctx": 4, "ql": 1},
        {"ctx": 33, "ql": 33, "spans": ((10, 20),)},
    ]
    backend = functools.partial(TorchAttentionBackend, compute_dtype=scores)
    seen: list[torch.dtype] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda q, *a, **k: seen.append(q.dtype) or sdpa(q, *a, **k)
    )
    out, ref = run_case(specs, hq=8, hkv=2, num_blocks=160, dtype=torch.bfloat16, backend_cls=backend)
    assert out.dtype == torch.bfloat16 and seen and set(seen) == {scores}
    check(out, ref, atol=2e-2)


def test_cpu_scores_are_bf16_only_for_a_bf16_cache_on_amx(monkeypatch):
    import mstar.engine.attention.torch_backend as tb

    cache = PagedKVCache(KVSpec(num_layers=1, num_kv_heads=2, head_dim=4), 4, BS, dtype=torch.bfloat16)
    for amx, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(tb, "amx_bf16", lambda amx=amx: amx)
        assert tb.cpu_score_dtype(torch.bfloat16) == expected
        assert tb.cpu_score_dtype(torch.float32) == torch.float32
        assert tb.cpu_score_dtype(torch.float16) == torch.float32
        assert TorchAttentionBackend(cache).compute_dtype == expected
    assert TorchAttentionBackend(cache, compute_dtype=torch.float32).compute_dtype == torch.float32
    monkeypatch.setattr(tb, "amx_bf16", lambda: True)
    monkeypatch.setattr(tb, "idle_scheduled", lambda: True)  # the edge box's batch group
    assert tb.cpu_score_dtype(torch.bfloat16) == torch.float32


def test_idle_scheduling_is_read_from_the_process():
    import subprocess
    import sys

    code = "import os; from mstar.engine.attention.torch_backend import idle_scheduled as i; a = i(); "
    code += "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)); print(a, i())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
