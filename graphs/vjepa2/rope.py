"""V-JEPA 2's 3-D rotary embedding, exactly as its released weights were trained with it.

Each head's dims split into three equal even blocks (depth / frame, height, width:
``2 * (head_dim // 3 // 2)`` each, e.g. 20/20/20 for head dim 64); dims past them are not rotated.
Within a block of size D, frequency ``w_i = 10000 ** (-i / (D / 2))`` and angle ``p * w_i``.
Meta's code tiles the D/2 angles by *concatenation* while it rotates *interleaved* pairs
(``(x[2i], x[2i+1]) -> (-x[2i+1], x[2i])``), so dim j uses angle ``theta[j mod D/2]`` and the two
members of a pair get different angles. The source keeps this for the checkpoints' sake; so do we.
It is neither norm-preserving nor shift-invariant: positions are absolute and must start at 0.
"""

from __future__ import annotations

import torch


def block_dim(head_dim: int) -> int:
    return 2 * ((head_dim // 3) // 2)


def rope_tables(
    head_dim: int, depth: torch.Tensor, height: torch.Tensor, width: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, head_dim] for rows at (depth, height, width) positions [N] (any numeric dtype)."""
    d = block_dim(head_dim)
    omega = torch.arange(d // 2, dtype=dtype, device=depth.device) / (d / 2.0)
    omega = 1.0 / 10000**omega
    parts_cos, parts_sin = [], []
    for pos in (depth, height, width):
        freq = pos.to(dtype)[:, None] * omega[None, :]  # [N, d/2]
        parts_cos.append(freq.cos().repeat(1, 2))  # tiled, not interleaved
        parts_sin.append(freq.sin().repeat(1, 2))
    rest = head_dim - 3 * d
    if rest:
        n = depth.shape[0]
        parts_cos.append(torch.ones(n, rest, dtype=dtype, device=depth.device))
        parts_sin.append(torch.zeros(n, rest, dtype=dtype, device=depth.device))
    return torch.cat(parts_cos, dim=1), torch.cat(parts_sin, dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim]; cos, sin [N, head_dim] -> rotated x (interleaved pairs)."""
    pairs = x.unflatten(-1, (-1, 2))
    partner = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos[:, None, :].to(x.dtype) + partner * sin[:, None, :].to(x.dtype)


def patch_grid_positions(grid: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(height, width) of a frame's patches in raster order, [grid * grid] each."""
    n = torch.arange(grid * grid, device=device)
    return n // grid, n % grid
