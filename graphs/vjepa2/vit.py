"""The transformer block V-JEPA 2's encoder and predictor share: pre-norm attention with 3-D RoPE
on a fused ``qkv`` projection, then a GELU MLP (Meta's ``Block`` / ``ACBlock``; LayerNorm eps 1e-6)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mstar_graphs.vjepa2.rope import apply_rope

# attention over rows: (layer, q [N, H, D], k, v, scale) -> [N, H, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int, **factory) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden, **factory)
        self.act = nn.GELU()  # exact erf, as nn.GELU's default in the reference
        self.fc2 = nn.Linear(hidden, width, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class RopeAttention(nn.Module):
    def __init__(self, width: int, heads: int, **factory) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.qkv = nn.Linear(width, 3 * width, **factory)  # rows [q; k; v], head-major in each
        self.proj = nn.Linear(width, width, **factory)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, self.head_dim).unbind(1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(layer, q, k, v.contiguous(), self.head_dim**-0.5)
        return self.proj(out.reshape(n, -1))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_hidden: int, eps: float, **factory) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=eps, **factory)
        self.attn = RopeAttention(width, heads, **factory)
        self.norm2 = nn.LayerNorm(width, eps=eps, **factory)
        self.mlp = Mlp(width, mlp_hidden, **factory)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, attend, layer)
        return x + self.mlp(self.norm2(x))


def dense_attend(batch: int, mask: torch.Tensor | None = None) -> Attend:
    """Attention over ``batch`` equal-length sequences packed row-wise, with an optional
    [L, L] bool mask (True: may attend) shared by all of them."""

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        n, h, d = q.shape
        shape = (batch, n // batch, h, d)
        qb, kb, vb = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).reshape(n, h, d)

    return attend
