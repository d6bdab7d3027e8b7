"""A lone query token's attention as a function of the cache tensors (what a compiled forward traces):
the same output and the same cache as the backend's own forward, for every block layout and mask."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.attention.lone_decode import LoneDecodeAttention, store_step_kv
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.kv_cache import KVSpec, PagedKVCache

LAYERS, HQ, HKV, D, BS = 3, 6, 2, 16, 4


def _backend(dtype: torch.dtype, compute_dtype: torch.dtype | None = None) -> TorchAttentionBackend:
    cache = PagedKVCache(KVSpec(LAYERS, HKV, D), num_blocks=12, block_size=BS, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))  # every slot holds a distinct finite key
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return TorchAttentionBackend(cache, compute_dtype)


def _plan_one_token(backend: TorchAttentionBackend, context: int, table: list[int], **seq) -> torch.Tensor:
    last = context - 1
    slot = torch.tensor([table[last // BS] * BS + last % BS])
    backend.plan(AttentionMetadata([SeqAttention(0, 1, context, table, **seq)], slot))
    return slot


@pytest.mark.parametrize(
    "table,mask",
    [
        ([3, 4, 5], {}),  # consecutive blocks: the backend reads them as a slice
        ([9, 2, 7], {}),  # scattered: gathered slot by slot
        ([1, 0, 6], {"mask": MaskKind.PREFIX_BIDIRECTIONAL, "mask_arg": 5}),
        ([8, 11, 4], {"mask": MaskKind.BLOCK_CAUSAL, "mask_arg": 3}),
        ([10, 3, 6], {"first_position": 32}),  # after sliding-window eviction dropped the first blocks
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_traceable_attention_matches_the_backend_and_stores_the_same_kv(table, mask, dtype):
    # the newest token sees every cached key under every mask kind: the masks pin that both agree on it
    context = 10
    ours, theirs = _backend(dtype), _backend(dtype)
    gen = torch.Generator().manual_seed(1)
    _plan_one_token(ours, context, table, **mask)
    slot = _plan_one_token(theirs, context, table, **mask)
    lone = ours.lone_decode()
    assert lone is not None and lone.cached_slots.tolist() == [table[p // BS] * BS + p % BS for p in range(context - 1)]
    assert torch.equal(lone.slot, slot) and lone.compute_dtype == ours.compute_dtype
    attn = LoneDecodeAttention(ours.cache.k, ours.cache.v, lone.cached_slots, lone.compute_dtype)
    for layer in (2, 0, 1):  # any order: each layer's K/V is stored at its own index
        q = torch.randn(1, HQ, D, generator=gen).to(dtype)
        k, v = torch.randn(1, HKV, D, generator=gen), torch.randn(1, HKV, D, generator=gen)  # fp32: cast on store
        got = attn(layer, q, k, v, 0.25)
        want = theirs.forward(layer, q, k, v, 0.25)
        assert got.dtype == want.dtype == dtype
        assert torch.equal(got, want)  # the same keys in the same order through the same SDPA call
    assert not torch.equal(ours.cache.k, theirs.cache.k)  # the traceable attention wrote nothing
    layers, keys, values = attn.step_kv()
    store_step_kv(ours.cache, layers, lone.slot, keys, values)
    assert torch.equal(ours.cache.k, theirs.cache.k) and torch.equal(ours.cache.v, theirs.cache.v)


def test_step_kv_lists_the_layers_in_call_order():
    backend = _backend(torch.float32)
    _plan_one_token(backend, 5, [0, 1])
    lone = backend.lone_decode()
    attn = LoneDecodeAttention(backend.cache.k, backend.cache.v, lone.cached_slots, None)
    for layer in (1, 0):
        attn(layer, torch.ones(1, HQ, D), torch.full((1, HKV, D), float(layer)), torch.zeros(1, HKV, D), 1.0)
    layers, keys, values = attn.step_kv()
    assert layers.tolist() == [1, 0] and keys.shape == values.shape == (2, 1, HKV, D)
    assert keys[:, 0, 0, 0].tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="layer 0 called attention twice"):
        attn(0, torch.ones(1, HQ, D), torch.ones(1, HKV, D), torch.ones(1, HKV, D), 1.0)


def test_only_a_lone_query_token_is_a_lone_decode():
    backend = _backend(torch.float32)
    two = AttentionMetadata([SeqAttention(0, 2, 6, [0, 1])], torch.tensor([4, 5]))  # a 2-token chunk
    backend.plan(two)
    assert backend.lone_decode() is None
    pair = AttentionMetadata([SeqAttention(0, 1, 6, [0, 1]), SeqAttention(1, 1, 3, [2])], torch.tensor([5, 10]))
    backend.plan(pair)  # two sequences decoding together
    assert backend.lone_decode() is None
    _plan_one_token(backend, 6, [0, 1])
    assert backend.lone_decode() is not None
