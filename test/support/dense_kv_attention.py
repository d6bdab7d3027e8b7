"""A paged-free ``attn(layer, q, k, v, scale)`` callback over a dense per-layer KV cache, for model tests.

Each forward's rows are placed after the cached ones (as the engine places a call's rows) and attend
to every cached key plus their own call's keys: causally (``causal=True``: a prefill or decode) or
all of them (``causal=False``: an image span). ``frozen=True`` computes against the cache without
appending to it (a flow step, whose rows are recomputed every step). ``fork()`` copies the cache.
"""

from __future__ import annotations

import torch

from support.attention_cases import dense_reference


class DenseKVAttention:
    def __init__(self, num_layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.causal = True
        self.frozen = False

    def __len__(self) -> int:
        """Rows cached (layer 0's)."""
        return 0 if self.k[0] is None else int(self.k[0].shape[0])

    def fork(self) -> DenseKVAttention:
        other = DenseKVAttention(len(self.k))
        other.k, other.v = list(self.k), list(self.v)
        return other

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        past_k, past_v = self.k[layer], self.v[layer]
        keys = k if past_k is None else torch.cat([past_k, k])
        values = v if past_v is None else torch.cat([past_v, v])
        if not self.frozen:
            self.k[layer], self.v[layer] = keys, values
        n, total = q.shape[0], keys.shape[0]
        past = total - n
        row = torch.arange(n)[:, None]
        key = torch.arange(total)[None, :]
        mask = key < past + (row + 1 if self.causal else n)
        return dense_reference(q, keys, values, mask, scale).to(q.dtype)
