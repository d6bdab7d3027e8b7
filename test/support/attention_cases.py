"""Paged-attention cases against dense attention on contiguous K/V: shared by the torch-backend tests
and tools/gpu_check.py (the same cases through FlashInfer on CUDA)."""

from __future__ import annotations

import math

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


def positions_mask(first, ctx, ql, kind, arg, spans=()):
    """Mask written out element by element, straight from the MaskKind docstring (``spans``:
    bidirectional [start, end) ranges of absolute positions)."""
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
            m[i, j] |= any(a <= qp < b and a <= kp < b for a, b in spans)
    return m


def run_case(
    specs,
    hq=4,
    hkv=2,
    d=16,
    dtype=torch.float32,
    num_blocks=64,
    seed=0,
    row_order=None,
    backend_cls=TorchAttentionBackend,
    device="cpu",
):
    """specs: dicts with ctx, ql and optional mask, arg, first, spans. Returns (out on CPU, float64 reference)."""
    g = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(KVSpec(num_layers=2, num_kv_heads=hkv, head_dim=d), num_blocks, BS, dtype=dtype, device=device)
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
            cache.write(
                layer, slot[: ctx - ql].to(device), k[: ctx - ql].to(device, dtype), v[: ctx - ql].to(device, dtype)
            )
        seqs.append(
            SeqAttention(
                starts[i],
                ql,
                ctx,
                blocks,
                sp.get("first", 0),
                sp.get("mask", MaskKind.CAUSAL),
                sp.get("arg", 0),
                tuple(sp.get("spans", ())),
            )
        )
        full.append((q, k, v))
        slots[i] = slot[ctx - ql :]
    T = t
    q_all, k_all, v_all = torch.empty(T, hq, d), torch.empty(T, hkv, d), torch.empty(T, hkv, d)
    slot_mapping = torch.empty(T, dtype=torch.int64)
    for i, (q, k, v) in enumerate(full):
        s, ql = starts[i], specs[i]["ql"]
        q_all[s : s + ql], k_all[s : s + ql], v_all[s : s + ql] = q, k[-ql:], v[-ql:]
        slot_mapping[s : s + ql] = slots[i]
    backend = backend_cls(cache)
    backend.plan(AttentionMetadata(seqs, slot_mapping.to(device)))
    out = backend.forward(layer, q_all.to(device, dtype), k_all.to(device, dtype), v_all.to(device, dtype), scale).cpu()
    ref = torch.empty(T, hq, d, dtype=torch.float64)
    for i, (q, k, v) in enumerate(full):
        sp, s = specs[i], starts[i]
        # The cache holds K/V in its dtype: the reference sees the same rounding.
        k, v, q = k.to(dtype), v.to(dtype), q.to(dtype)
        mask = positions_mask(
            sp.get("first", 0),
            sp["ctx"],
            sp["ql"],
            sp.get("mask", MaskKind.CAUSAL),
            sp.get("arg", 0),
            sp.get("spans", ()),
        )
        ref[s : s + sp["ql"]] = dense_reference(q, k, v, mask, scale)
    return out, ref
