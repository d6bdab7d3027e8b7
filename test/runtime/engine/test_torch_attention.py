"""TorchAttentionBackend against dense attention on contiguous K/V."""
import math

import pytest
import torch

from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.kv_cache import KVSpec, PagedKVCache

BS = 4  # small blocks so sequences span many, scattered blocks


def dense_reference(q, k, v, mask, scale):
    """q [Lq, Hq, D], k/v [Lk, Hkv, D], mask [Lq, Lk] bool -> [Lq, Hq, D] (float64)."""
    g = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def positions_mask(first, ctx, ql, kind, arg):
    """Mask written out element by element, straight from the MaskKind docstring."""
    m = torch.zeros(ql, ctx, dtype=torch.bool)
    for i in range(ql):
        qp = first + ctx - ql + i
        for j in range(ctx):
            kp = first + j
            if kind == MaskKind.CAUSAL:
                m[i, j] = kp <= qp
            elif kind == MaskKind.PREFIX_BIDIRECTIONAL:
                m[i, j] = kp <= qp or (kp < arg and qp < arg)
            else:
                m[i, j] = kp // arg <= qp // arg
    return m


def run_case(specs, hq=4, hkv=2, d=16, dtype=torch.float32, num_blocks=64, seed=0, row_order=None):
    """specs: dicts with ctx, ql and optional mask, arg, first. Returns (out, reference, q dtype)."""
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(KVSpec(num_layers=2, num_kv_heads=hkv, head_dim=d), num_blocks, BS, dtype=dtype)
    free = torch.randperm(num_blocks, generator=g).tolist()  # random, non-contiguous blocks
    layer, scale = 1, 1 / math.sqrt(d)
    order = row_order or list(range(len(specs)))
    starts, t = {}, 0
    for i in order:
        starts[i] = t
        t += specs[i]["ql"]
    seqs, full, slots = [], [], [None] * len(specs)
    for i, sp in enumerate(specs):
        ctx, ql = sp["ctx"], sp["ql"]
        blocks = [free.pop() for _ in range(-(-ctx // BS))]
        slot = torch.tensor([blocks[j // BS] * BS + j % BS for j in range(ctx)])
        k = torch.randn(ctx, hkv, d, generator=g)
        v = torch.randn(ctx, hkv, d, generator=g)
        q = torch.randn(ql, hq, d, generator=g)
        if ctx > ql:  # earlier steps already cached these
            cache.write(layer, slot[:ctx - ql], k[:ctx - ql], v[:ctx - ql])
        seqs.append(SeqAttention(starts[i], ql, ctx, blocks, sp.get("first", 0),
                                 sp.get("mask", MaskKind.CAUSAL), sp.get("arg", 0)))
        full.append((q, k, v))
        slots[i] = slot[ctx - ql:]
    T = t
    q_all, k_all, v_all = torch.empty(T, hq, d), torch.empty(T, hkv, d), torch.empty(T, hkv, d)
    slot_mapping = torch.empty(T, dtype=torch.int64)
    for i, (q, k, v) in enumerate(full):
        s, ql = starts[i], specs[i]["ql"]
        q_all[s:s + ql], k_all[s:s + ql], v_all[s:s + ql] = q, k[-ql:], v[-ql:]
        slot_mapping[s:s + ql] = slots[i]
    backend = TorchAttentionBackend(cache)
    backend.plan(AttentionMetadata(seqs, slot_mapping))
    out = backend.forward(layer, q_all.to(dtype), k_all.to(dtype), v_all.to(dtype), scale)
    ref = torch.empty(T, hq, d, dtype=torch.float64)
    for i, (q, k, v) in enumerate(full):
        sp, s = specs[i], starts[i]
        # The cache holds K/V in its dtype: the reference sees the same rounding.
        k, v, q = k.to(dtype), v.to(dtype), q.to(dtype)
        mask = positions_mask(sp.get("first", 0), sp["ctx"], sp["ql"], sp.get("mask", MaskKind.CAUSAL), sp.get("arg", 0))
        ref[s:s + sp["ql"]] = dense_reference(q, k, v, mask, scale)
    return out, ref


def check(out, ref, atol=1e-5):
    assert out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=atol)


@pytest.mark.parametrize("kind,arg", [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 7),
                                      (MaskKind.BLOCK_CAUSAL, 3)])
def test_full_prefill_each_mask(kind, arg):
    out, ref = run_case([{"ctx": 13, "ql": 13, "mask": kind, "arg": arg}])
    check(out, ref)


@pytest.mark.parametrize("kind,arg", [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 12),
                                      (MaskKind.BLOCK_CAUSAL, 5)])
def test_chunked_prefill_each_mask(kind, arg):
    # 6 new tokens on top of 9 cached ones; the prefix / frame boundaries cut through the chunk.
    out, ref = run_case([{"ctx": 15, "ql": 6, "mask": kind, "arg": arg}])
    check(out, ref)


def test_masks_differ():
    """Guard the reference: the three masks really produce different attention here."""
    outs = [run_case([{"ctx": 12, "ql": 12, "mask": m, "arg": a}])[0]
            for m, a in [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 6), (MaskKind.BLOCK_CAUSAL, 4)]]
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[0], outs[2])


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])
def test_gqa(hq, hkv):
    out, ref = run_case([{"ctx": 10, "ql": 10}, {"ctx": 9, "ql": 1}, {"ctx": 5, "ql": 1}], hq=hq, hkv=hkv)
    check(out, ref)


def test_mixed_batch_prefill_chunks_and_decodes():
    specs = [
        {"ctx": 17, "ql": 17},                                        # fresh prefill
        {"ctx": 1, "ql": 1},                                          # decode, one key
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


@pytest.mark.parametrize("kind,arg", [(MaskKind.CAUSAL, 0), (MaskKind.PREFIX_BIDIRECTIONAL, 14),
                                      (MaskKind.BLOCK_CAUSAL, 6)])
def test_first_position_after_eviction(kind, arg):
    # Cached tokens start at absolute position 8 (two blocks evicted): the masks must use
    # absolute positions, e.g. the prefix [0, 14) now covers only table tokens [0, 6).
    out, ref = run_case([{"ctx": 14, "ql": 5, "first": 8, "mask": kind, "arg": arg},
                         {"ctx": 10, "ql": 1, "first": 4}])
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
