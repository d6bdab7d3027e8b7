"""BAGEL's fixed sinusoids: the 2-D sin-cos position table and the timestep frequencies.

2-D table (``modeling_utils.get_2d_sincos_pos_embed``), for a ``grid`` x ``grid`` table of width D:
row ``r * grid + c`` (patch row r, column c) is ``[emb1d(c), emb1d(r)]`` - the COLUMN coordinate
first - where ``emb1d(pos) = [sin(pos * w), cos(pos * w)]`` (sin first) over D/2 values with
``w_k = 10000 ** (-k / (D / 4))``. Computed in float64 with numpy (as the reference, so the float32
table is bit-identical), returned as float32. The release stores the table (bf16) in the checkpoint.

Timestep frequencies (``TimestepEmbedder.timestep_embedding``): ``[cos(t * f), sin(t * f)]`` - COS
first, the opposite of the table - with ``f_k = exp(-ln(10000) * k / half)``, in float32, t as given
(no x1000).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def _sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
    omega = np.arange(dim // 2, dtype=np.float64)
    omega /= dim / 2.0
    omega = 1.0 / 10000**omega
    angles = np.einsum("m,d->md", positions.reshape(-1), omega)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_2d_table(dim: int, grid: int) -> torch.Tensor:
    """float32 [grid * grid, dim]; ``dim`` must be a multiple of 4 (two coordinates, each sin | cos)."""
    if dim <= 0 or dim % 4:
        raise ValueError(f"sin-cos table width must be a positive multiple of 4, got {dim}")
    if grid <= 0:
        raise ValueError(f"sin-cos table grid must be > 0, got {grid}")
    coords = np.arange(grid, dtype=np.float32)
    cols, rows = np.meshgrid(coords, coords)  # cols[r, c] = c: meshgrid's first output varies along a row
    table = np.concatenate([_sincos_1d(dim // 2, cols), _sincos_1d(dim // 2, rows)], axis=1)
    return torch.from_numpy(table).float()


def timestep_frequencies(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """t [N] -> float32 [N, dim] = [cos(t * f), sin(t * f)] (+ a zero column when ``dim`` is odd)."""
    if t.dim() != 1:
        raise ValueError(f"timesteps must be a 1-D tensor, got shape {tuple(t.shape)}")
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half).to(t.device)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class SinCosPositionTable(nn.Module):
    """``pos_embed`` [grid**2, dim]: the frozen 2-D sin-cos table (a Parameter without grad, so it is in
    the state dict, as ``modeling_utils.PositionEmbedding``); ``forward(ids)`` gathers rows."""

    def __init__(
        self, grid: int, dim: int, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        if torch.device(device or "cpu").type == "meta":  # filled by the checkpoint: skip the float64 work
            table = torch.empty(grid * grid, dim, dtype=dtype, device="meta")
        else:
            table = sincos_2d_table(dim, grid).to(dtype=dtype or torch.float32, device=device)
        self.grid = grid
        self.pos_embed = nn.Parameter(table, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.pos_embed[ids]
