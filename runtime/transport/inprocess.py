"""In-process tensor transport: handles name tensors in one shared store (no copies)."""

from __future__ import annotations

import itertools
import threading

import torch

from mstar.transport.handle import TensorHandle, TensorRef


class InProcessTensorStore:
    """Thread-safe map handle -> tensor, with explicit frees per owner (request)."""

    location = "inproc"

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self._by_owner: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def put(self, tensor: torch.Tensor, owner: str) -> TensorHandle:
        key = f"{owner}/{next(self._ids)}"
        with self._lock:
            self._tensors[key] = tensor
            self._by_owner.setdefault(owner, []).append(key)
        return TensorHandle(key, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), self.location)

    def get(self, handle: TensorHandle) -> torch.Tensor:
        try:
            return self._tensors[handle.key]
        except KeyError:
            raise KeyError(f"tensor {handle.key} is not (or no longer) in the in-process store") from None

    def resolve(self, ref: TensorRef) -> torch.Tensor | list[torch.Tensor]:
        """A handle's tensor; a chunk's handles stacked, or as a list when their shapes differ (ragged
        items: a stream of audio pieces, the shorter last one)."""
        if isinstance(ref, list):
            items = [self.get(h) for h in ref]
            if len({(t.shape, t.dtype) for t in items}) > 1:
                return items
            return torch.stack(items)
        return self.get(ref)

    def free_owner(self, owner: str) -> int:
        with self._lock:
            keys = self._by_owner.pop(owner, [])
            for key in keys:
                self._tensors.pop(key, None)
        return len(keys)

    def __len__(self) -> int:
        return len(self._tensors)
