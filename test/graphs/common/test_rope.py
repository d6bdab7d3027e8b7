"""Rotary embedding: half tables, the full-width rotation tables, and the attention's joint q|k rotation."""

from __future__ import annotations

import math

import pytest
import torch

from mstar_graphs.common.attention import GQAttention
from mstar_graphs.common.rope import apply_rope, rope_inv_freq, rope_tables, rotation_tables


def tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope_tables(rope_inv_freq(head_dim, 10000.0), 64)
    return cos.index_select(0, positions).to(dtype), sin.index_select(0, positions).to(dtype)


def rotated_pairs(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Independent fp64 reference: element j and j + D/2 form a complex number turned by pos * freq_j."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angle = positions.double()[:, None, None] * freq
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_tables_rotate_bit_for_bit_as_half_tables(dtype):
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 7, 63])
    x = torch.randn(4, 5, 32, generator=g).to(dtype)
    cos, sin = tables(positions, 32, dtype)
    full = apply_rope(x, *rotation_tables(cos, sin))
    assert torch.equal(full, apply_rope(x, cos, sin))
    assert math.isclose(
        float((full.double() - rotated_pairs(x, positions)).abs().max()),
        0.0,
        abs_tol=1e-5 if dtype == torch.float32 else 0.1,
    )


def test_attention_rotates_q_and_k_together_as_each_alone():
    torch.manual_seed(0)
    attn = GQAttention(48, 6, 2, 16, 0)
    attn.fuse()
    positions = torch.tensor([3, 4, 5])
    x = torch.randn(3, 48)
    cos, sin = tables(positions, 16, torch.float32)
    q, k, v = attn.project(x, *rotation_tables(cos, sin))
    split_q, split_k, split_v = attn.qkv_proj(x).split([6 * 16, 2 * 16, 2 * 16], dim=-1)
    assert torch.equal(q, apply_rope(split_q.reshape(3, 6, 16), cos, sin))
    assert torch.equal(k, apply_rope(split_k.reshape(3, 2, 16), cos, sin))
    assert torch.equal(v, split_v.reshape(3, 2, 16))
    assert torch.allclose(q.double(), rotated_pairs(split_q.reshape(3, 6, 16), positions), atol=1e-5)
