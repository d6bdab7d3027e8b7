"""The attention backend interface and its run-time choice (FlashInfer on CUDA, torch elsewhere)."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from mstar.engine.attention.decode_step import DecodeStep
from mstar.engine.attention.metadata import AttentionMetadata
from mstar.engine.kv_cache import PagedKVCache


class AttentionBackend(ABC):
    """Writes each step's new K/V into the paged cache and attends over it.

    ``plan`` runs once per engine step (index/mask building shared by all layers);
    ``forward`` runs once per layer. The model calls the backend through
    ``AttentionContext`` and never sees blocks or masks.
    """

    name: str = "abstract"

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache

    @abstractmethod
    def plan(self, meta: AttentionMetadata) -> None: ...

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D] (the step's new tokens) -> [T, Hq, D]."""

    def decode_step(self) -> DecodeStep | None:
        """The planned step as a :class:`DecodeStep` when it is one query token of each sequence and
        this backend's attention can be traced into a compiled forward (None: call ``forward``)."""
        return None


class AttentionContext:
    """What an AR model's attention layers call: ``attn(layer, q, k, v, scale)``."""

    def __init__(self, backend: AttentionBackend) -> None:
        self._backend = backend

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return self._backend.forward(layer, q, k, v, scale)

    def decode_step(self) -> DecodeStep | None:
        return self._backend.decode_step()
