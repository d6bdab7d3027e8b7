"""A decode step's attention as a function of the cache tensors (what a compiled forward traces): the
backend's own forward's output and cache, for every block layout, mask, row count and context length."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.attention.decode_step import MIN_KEYS, DecodeStepAttention, store_step_kv
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.kv_cache import KVSpec, PagedKVCache

LAYERS, HQ, HKV, D, BS = 3, 6, 2, 16, 4


def _backend(dtype: torch.dtype, compute_dtype: torch.dtype | None = None) -> TorchAttentionBackend:
    cache = PagedKVCache(KVSpec(LAYERS, HKV, D), num_blocks=16, block_size=BS, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))  # every slot holds a distinct finite key
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return TorchAttentionBackend(cache, compute_dtype)


def _slot(table: list[int], position: int) -> int:
    return table[position // BS] * BS + position % BS


def _plan_decode(backend: TorchAttentionBackend, rows: list[tuple[int, list[int], dict]]) -> torch.Tensor:
    """One query token of each (context, block table, mask) in ``rows``; their own slots."""
    seqs = [SeqAttention(i, 1, context, table, **mask) for i, (context, table, mask) in enumerate(rows)]
    slots = torch.tensor([_slot(table, context - 1) for context, table, _ in rows])
    backend.plan(AttentionMetadata(seqs, slots))
    return slots


CASES = {
    "consecutive": [(10, [3, 4, 5], {})],  # the backend reads one sequence's keys as a slice
    "scattered": [(10, [9, 2, 7], {})],
    "prefix_mask": [(10, [1, 0, 6], {"mask": MaskKind.PREFIX_BIDIRECTIONAL, "mask_arg": 5})],
    "block_causal": [(10, [8, 11, 4], {"mask": MaskKind.BLOCK_CAUSAL, "mask_arg": 3})],
    "evicted_front": [(10, [10, 3, 6], {"first_position": 32})],  # sliding-window eviction dropped blocks
    "one_key_before": [(2, [12], {})],  # padded to MIN_KEYS key columns
    "rows_of_any_length": [
        (10, [9, 2, 7], {}),
        (2, [12], {}),
        (13, [0, 1, 13, 14], {"mask": MaskKind.PREFIX_BIDIRECTIONAL, "mask_arg": 4}),
        (5, [15, 5], {"mask": MaskKind.BLOCK_CAUSAL, "mask_arg": 2}),
    ],
    "rows_alike": [(7, [9, 2], {}), (7, [12, 15], {})],  # no padding at all
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_traceable_attention_matches_the_backend_and_stores_the_same_kv(case, dtype):
    # a sequence's newest token sees every cached key under every mask kind: the masks pin that both agree
    rows = CASES[case]
    ours, theirs = _backend(dtype), _backend(dtype)
    gen = torch.Generator().manual_seed(1)
    _plan_decode(ours, rows)
    slots = _plan_decode(theirs, rows)
    step = ours.decode_step()
    assert step is not None and torch.equal(step.slots, slots)
    width = max(MIN_KEYS, *(context - 1 for context, _, _ in rows))
    assert step.cached_slots.shape == (len(rows), width) and step.key_mask.shape == (len(rows), 1, 1, width + 1)
    assert step.compute_dtype == ours.compute_dtype
    for r, (context, table, _) in enumerate(rows):  # each row's cached keys in order, then masked padding
        cached = [_slot(table, p) for p in range(context - 1)]
        assert step.cached_slots[r, : context - 1].tolist() == cached
        assert set(step.cached_slots[r, context - 1 :].tolist()) <= set(cached)
        assert step.key_mask[r, 0, 0].tolist() == [True] * (context - 1) + [False] * (width - context + 1) + [True]

    attn = DecodeStepAttention(ours.cache.k, ours.cache.v, step.cached_slots, step.key_mask, step.compute_dtype)
    for layer in (2, 0, 1):  # any order: each layer's K/V is stored at its own index
        q = torch.randn(len(rows), HQ, D, generator=gen).to(dtype)
        k, v = torch.randn(len(rows), HKV, D, generator=gen), torch.randn(len(rows), HKV, D, generator=gen)
        got = attn(layer, q, k, v, 0.25)  # fp32 K/V: cast on store
        want = theirs.forward(layer, q, k, v, 0.25)
        assert got.dtype == want.dtype == dtype
        # the same keys; masked padding and another key order only change the rounding
        tolerance = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    assert not torch.equal(ours.cache.k, theirs.cache.k)  # the traceable attention wrote nothing
    layers, keys, values = attn.step_kv()
    assert keys.shape == values.shape == (3, len(rows), HKV, D)
    store_step_kv(step, layers, keys, values)
    assert torch.equal(ours.cache.k, theirs.cache.k) and torch.equal(ours.cache.v, theirs.cache.v)


def test_step_kv_lists_the_layers_in_call_order():
    backend = _backend(torch.float32)
    _plan_decode(backend, [(5, [0, 1], {})])
    step = backend.decode_step()
    attn = DecodeStepAttention(backend.cache.k, backend.cache.v, step.cached_slots, step.key_mask, None)
    for layer in (1, 0):
        attn(layer, torch.ones(1, HQ, D), torch.full((1, HKV, D), float(layer)), torch.zeros(1, HKV, D), 1.0)
    layers, keys, values = attn.step_kv()
    assert layers.tolist() == [1, 0] and keys.shape == values.shape == (2, 1, HKV, D)
    assert keys[:, 0, 0, 0].tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="layer 0 called attention twice"):
        attn(0, torch.ones(1, HQ, D), torch.ones(1, HKV, D), torch.ones(1, HKV, D), 1.0)


def test_only_a_step_of_newest_tokens_in_order_is_a_decode_step():
    backend = _backend(torch.float32)
    backend.plan(AttentionMetadata([SeqAttention(0, 2, 6, [0, 1])], torch.tensor([4, 5])))  # a 2-token chunk
    assert backend.decode_step() is None
    mixed = [SeqAttention(0, 1, 6, [0, 1]), SeqAttention(1, 3, 3, [2])]  # a decode beside a prefill
    backend.plan(AttentionMetadata(mixed, torch.tensor([5, 8, 9, 10])))
    assert backend.decode_step() is None
    grouped = [SeqAttention(0, 1, 6, [0, 1]), SeqAttention(1, 3, 3, [2]), SeqAttention(4, 3, 3, [3])]
    backend.plan(AttentionMetadata(grouped, torch.tensor([5, 8, 9, 10, 12, 13, 14])))  # prefills in one group
    assert backend._groups and backend.decode_step() is None
    swapped = [SeqAttention(1, 1, 6, [0, 1]), SeqAttention(0, 1, 3, [2])]  # rows not in the sequences' order
    backend.plan(AttentionMetadata(swapped, torch.tensor([10, 5])))
    assert backend.decode_step() is None
    first = [SeqAttention(0, 1, 6, [0, 1]), SeqAttention(1, 1, 1, [2])]  # a token with no key before it
    backend.plan(AttentionMetadata(first, torch.tensor([5, 8])))
    assert backend.decode_step() is None
    idle = [SeqAttention(0, 1, 6, [0, 1]), SeqAttention(1, 0, 3, [2]), SeqAttention(1, 1, 3, [3])]
    backend.plan(AttentionMetadata(idle, torch.tensor([5, 14])))  # a sequence with no token this step
    step = backend.decode_step()
    assert step is not None and step.cached_slots.shape[0] == 2 and step.slots.tolist() == [5, 14]
