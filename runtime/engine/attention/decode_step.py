"""A decode step (every sequence of the step adds one query token), as attention a compiled forward
can trace into its graph.

An opaque attention op costs a Python call per layer (~200 us each on CPU, ~45 us of it SDPA: the
custom-op dispatch, the backend's own wrapping), which is a third of a small model's decode step at
one stream and a quarter of the voice model's at four. A query token that is its sequence's newest
sees every key cached before it plus its own, under every mask kind, so a decode step's attention is
a plain function of the cache tensors, the slots of each row's cached keys and which of them are
padding: :class:`DecodeStepAttention`, which dynamo traces like the rest of the model.

A compiled forward traces it twice: for one row, and for any number of rows from 2 on (dynamo
specialises sizes 0 and 1; padding a lone row to two instead cost 29% of an int4 token on the
108-layer decode preset, 38.5 -> 49.6 ms). The key count is symbolic in both: every row's cached keys
are padded to at least ``MIN_KEYS`` (repeating one of its own, masked out).

The graph does not write the cache: writing into a graph input makes inductor copy the whole input
in and out (functionalization; measured 57 -> 80 ms a token on the 108-layer decode preset). It
attends over the cached keys with the step's own K/V appended, returns the step's K/V, and the
caller stores them afterwards with one indexed write for all layers (:func:`store_step_kv`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mstar.engine.kv_cache import PagedKVCache

MIN_KEYS = 2  # a decode step's inputs have at least this many cached keys per row (see the docstring)


def one_query_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    compute_dtype: torch.dtype,
    key_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query row per sequence: q [B, Hq, D], keys / values [B, n, Hkv, D] (``key_mask`` [B, 1, 1, n]
    or None) -> [B, Hq, D] in q's dtype, scores in ``compute_dtype``. The G query heads of a KV head
    attend as G rows of it, so K/V are not repeated (heads_as_rows of one query row is a plain view)."""
    batch, hq, head_dim = q.shape
    hkv = keys.shape[2]
    rows = q.to(compute_dtype).reshape(batch, hkv, hq // hkv, head_dim)
    keys = keys.to(compute_dtype).transpose(1, 2)
    values = values.to(compute_dtype).transpose(1, 2)
    out = F.scaled_dot_product_attention(rows, keys, values, attn_mask=key_mask, scale=scale)
    return out.reshape(batch, hq, head_dim).to(q.dtype)


@dataclass(frozen=True)
class DecodeStep:
    """The running step is one query token of each of B sequences, packed in their order (row r: the
    r-th). ``n >= MIN_KEYS`` key columns: row r's cached keys, in order, then padding that repeats one."""

    cache: PagedKVCache
    cached_slots: torch.Tensor  # [B, n] int64: flat slots of each row's keys cached before its token
    key_mask: torch.Tensor  # [B, 1, 1, n + 1] bool: True where the row attends (its own key is the last)
    slots: torch.Tensor  # [B] int64: where each row's own K/V go
    compute_dtype: torch.dtype | None  # what scores are computed in (the backend's choice; None: q's dtype)


class DecodeStepAttention:
    """What a traced forward's layers call for a decode step: ``attn(layer, q, k, v, scale)``, q [B, Hq, D].

    Records the step's K/V of each layer it is called for (``step_kv``); each layer once.
    """

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cached_slots: torch.Tensor,
        key_mask: torch.Tensor,
        compute_dtype: torch.dtype | None,
    ) -> None:
        layers, _, _, kv_heads, head_dim = k_cache.shape
        self.k_cache = k_cache.view(layers, -1, kv_heads, head_dim)  # [layers, slots, Hkv, D]
        self.v_cache = v_cache.view(layers, -1, kv_heads, head_dim)
        self.cached_slots = cached_slots
        self.key_mask = key_mask
        self.compute_dtype = compute_dtype
        self.layers: list[int] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if layer in self.layers:
            raise ValueError(f"layer {layer} called attention twice in one forward: its K/V slot would be ambiguous")
        cache_dtype = self.k_cache.dtype
        k, v = k.to(cache_dtype), v.to(cache_dtype)  # what the cache will hold, and what eager attends to
        self.layers.append(layer)
        self.keys.append(k)
        self.values.append(v)
        rows, width = self.cached_slots.shape
        flat = self.cached_slots.reshape(-1)
        shape = (rows, width, k.shape[1], k.shape[2])
        # [B, n + 1, Hkv, D]: each row's cached keys, then its own (the newest position)
        keys = torch.cat([self.k_cache[layer].index_select(0, flat).view(shape), k[:, None]], 1)
        values = torch.cat([self.v_cache[layer].index_select(0, flat).view(shape), v[:, None]], 1)
        return one_query_attention(q, keys, values, scale, self.compute_dtype or q.dtype, self.key_mask)

    def step_kv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(layers [L], keys [L, B, Hkv, D], values [L, B, Hkv, D]) of the layers called, in call order."""
        layers = torch.tensor(self.layers, dtype=torch.int64, device=self.k_cache.device)
        return layers, torch.stack(self.keys), torch.stack(self.values)


def store_step_kv(step: DecodeStep, layers: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Writes what :meth:`DecodeStepAttention.step_kv` returned at the step's slots of those layers."""
    spec = step.cache.spec
    where = (layers[:, None], step.slots[None, :])
    step.cache.k.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim)[where] = keys
    step.cache.v.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim)[where] = values
