"""The paged KV cache tensors: one K and one V pool of fixed-size blocks per layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVSpec:
    """Shape of one token's KV in one layer: the engine sizes the paged cache from it."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.empty((), dtype=dtype).element_size()


class PagedKVCache:
    """``k[layer]`` / ``v[layer]``: [num_blocks, block_size, num_kv_heads, head_dim].

    A flat slot ``s`` is token ``s % block_size`` of block ``s // block_size``.
    """

    def __init__(
        self,
        spec: KVSpec,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"KV cache needs num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}")
        self.spec = spec
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        shape = (spec.num_layers, num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the step's new K/V ([T, Hkv, D]) at their flat slots."""
        flat_k = self.k[layer].view(-1, self.spec.num_kv_heads, self.spec.head_dim)
        flat_v = self.v[layer].view(-1, self.spec.num_kv_heads, self.spec.head_dim)
        flat_k.index_copy_(0, slot_mapping, k.to(self.dtype))
        flat_v.index_copy_(0, slot_mapping, v.to(self.dtype))

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole blocks ``src -> dst`` in every layer (copy-on-write after a fork)."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
