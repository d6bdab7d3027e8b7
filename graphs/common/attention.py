"""Grouped-query self-attention of the decoder LLMs (Llama, Gemma, Qwen3) over packed rows.

What the families differ in are options: ``bias`` on the projections (Qwen2-style checkpoints),
``qk_norm_eps`` for Qwen3's per-head RMSNorm of q and k before RoPE. Parameter names are the
checkpoints' (``q_proj`` ... ``o_proj``, ``q_norm``, ``k_norm``), so weights load by name.

Rows arrive packed ([T, hidden], any mix of sequences), so nothing here knows about batches or
KV: :meth:`GQAttention.forward` hands q, k, v to the caller's ``attn(layer, q, k, v, scale)`` (the
AR engine's paged KV, or a dense cache). A caller with its own attention (Code2Wav's sliding
window) uses :meth:`GQAttention.project` and ``o_proj``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mstar.layers.tensor_parallel import RowParallelLinear, column_parallel
from mstar.parallel.group import TPGroup
from mstar_graphs.common.fused_linear import fused_linear
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.common.rope import apply_rope

AttnFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


class GQAttention(nn.Module):
    """``layer_idx`` names the KV layer ``attn`` reads and writes."""

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        layer_idx: int,
        *,
        bias: bool = False,
        qk_norm_eps: float | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        factory = {"dtype": dtype, "device": device}
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias, **factory)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=bias, **factory)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, qk_norm_eps, **factory)
            self.k_norm = RMSNorm(head_dim, qk_norm_eps, **factory)

    def fuse(self) -> None:
        """One q|k|v matmul instead of three (after loading: the checkpoint names are gone)."""
        self.qkv_proj = fused_linear([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def shard(self, tp: TPGroup) -> None:
        """Keep this rank's heads (Megatron-style): q, k, v column-parallel by whole heads (q_norm and
        k_norm act per head, so they stay whole), o_proj row-parallel. Before :meth:`fuse`."""
        if hasattr(self, "qkv_proj"):
            raise RuntimeError("shard the attention before fusing its projections")
        self.q_proj, self.k_proj, self.v_proj = (
            column_parallel(p, tp) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        self.o_proj = RowParallelLinear(self.o_proj, tp)  # type: ignore[assignment]
        self.num_heads, self.num_kv_heads = self.num_heads // tp.size, self.num_kv_heads // tp.size

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, hidden]; cos, sin [T, head_dim/2] (or the full-width ``rotation_tables``) -> q [T, heads, D],
        k and v [T, kv_heads, D] (q, k rotated)."""
        t, d = x.shape[0], self.head_dim
        if hasattr(self, "qkv_proj"):
            qkv = self.qkv_proj(x)
            if not hasattr(self, "q_norm"):  # q and k rotated in one go: half the ops of one per tensor
                heads = self.num_heads + self.num_kv_heads
                qk = apply_rope(qkv[:, : heads * d].reshape(t, heads, d), cos, sin)
                return (
                    qk[:, : self.num_heads],
                    qk[:, self.num_heads :],
                    qkv[:, heads * d :].reshape(t, self.num_kv_heads, d),
                )
            q, k, v = qkv.split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k = q.reshape(t, self.num_heads, d), k.reshape(t, self.num_kv_heads, d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.reshape(t, self.num_kv_heads, d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttnFn) -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        out = attn(self.layer_idx, q, k, v, self.scale)
        return self.o_proj(out.reshape(x.shape[0], self.num_heads * self.head_dim))
