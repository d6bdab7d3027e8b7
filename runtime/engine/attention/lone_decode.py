"""A step of one query token, as attention a compiled forward can trace into its graph.

An opaque attention op costs a Python call per layer (~200 us each on CPU, ~45 us of it SDPA: the
custom-op dispatch, SDPA's own wrapping), which at one token is a third of a small model's
decode step. A lone query token (a decode step, or a prefill's last token after a prefix-cache
hit) sees every key cached before it plus its own, under every mask kind, so its attention is a
plain function of the cache tensors and the slots of those keys: :class:`LoneDecodeAttention`,
which dynamo traces like the rest of the model.

The graph does not write the cache: writing one slot of a graph input makes inductor copy the whole
input in and out (functionalization; measured 57 -> 80 ms a token on the 108-layer decode preset).
It attends over the cached keys with the step's own K/V appended, returns the step's K/V, and the
caller stores them afterwards with one indexed write for all layers (:func:`store_step_kv`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mstar.engine.kv_cache import PagedKVCache


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
class LoneDecode:
    """The running step is one query token of one sequence."""

    cache: PagedKVCache
    cached_slots: torch.Tensor  # [context_len - 1] int64: flat slots of the keys cached before it, in order
    slot: torch.Tensor  # [1] int64: where its own K/V go
    compute_dtype: torch.dtype | None  # what scores are computed in (the backend's choice; None: q's dtype)


class LoneDecodeAttention:
    """What a traced forward's layers call for one query token: ``attn(layer, q, k, v, scale)``.

    Records the step's K/V of each layer it is called for (``step_kv``); each layer once.
    """

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cached_slots: torch.Tensor,
        compute_dtype: torch.dtype | None,
    ) -> None:
        layers, _, _, kv_heads, head_dim = k_cache.shape
        self.k_cache = k_cache.view(layers, -1, kv_heads, head_dim)  # [layers, slots, Hkv, D]
        self.v_cache = v_cache.view(layers, -1, kv_heads, head_dim)
        self.cached_slots = cached_slots
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
        # [1, n, Hkv, D]: the cached keys in order, then the step's own (the newest position)
        keys = torch.cat([self.k_cache[layer].index_select(0, self.cached_slots), k])[None]
        values = torch.cat([self.v_cache[layer].index_select(0, self.cached_slots), v])[None]
        return one_query_attention(q, keys, values, scale, self.compute_dtype or q.dtype)

    def step_kv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(layers [L], keys [L, 1, Hkv, D], values [L, 1, Hkv, D]) of the layers called, in call order."""
        layers = torch.tensor(self.layers, dtype=torch.int64, device=self.k_cache.device)
        return layers, torch.stack(self.keys), torch.stack(self.values)


def store_step_kv(
    cache: PagedKVCache, layers: torch.Tensor, slot: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
) -> None:
    """Writes what :meth:`LoneDecodeAttention.step_kv` returned at ``slot`` of those layers."""
    spec = cache.spec
    where = (layers[:, None], slot[None, :])
    cache.k.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim)[where] = keys
    cache.v.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim)[where] = values
