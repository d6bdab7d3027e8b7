"""Rotary position embedding, rotate-half convention (HF Llama / Gemma / Qwen): frequencies, tables, rotation."""

from __future__ import annotations

import torch
from torch import nn


def rope_inv_freq(dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies [dim/2] in fp32: theta ** (-2j / dim)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


def rope_tables(inv_freq: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, dim/2] in fp32 for positions 0 .. length - 1.

    Half width is enough: rotate-half RoPE uses the same angle for element j and j + D/2.
    """
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def register_rope_tables(
    module: nn.Module, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, device: torch.device | str | None
) -> None:
    """``module.rope_cos`` / ``rope_sin``, cast once to ``dtype`` as transformers casts cos/sin to the
    activations'. Non-persistent: derived from the config, never in a checkpoint (the loader's strict
    check would otherwise ask for them). A meta-device build gets them on the CPU."""
    target = device if device is not None and torch.device(device).type != "meta" else "cpu"
    module.register_buffer("rope_cos", cos.to(device=target, dtype=dtype), persistent=False)
    module.register_buffer("rope_sin", sin.to(device=target, dtype=dtype), persistent=False)


def rotation_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Half tables [T, D/2] -> full-width rotation tables [T, D]: ``cos | cos`` and ``-sin | sin``.

    Built once per forward (not per layer): with them :func:`apply_rope` is one multiply-add with
    the halves swapped, fewer tensor ops per layer than with half tables, and bit for bit the same.
    """
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos, sin: half tables [T, D/2] (element j and j + D/2 share an angle) or the
    full-width tables of :func:`rotation_tables` [T, D]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    if cos.shape[-1] == x.shape[-1]:
        # x1*c + x2*(-s) is x1*c - x2*s exactly (negation is exact), so both forms agree bit for bit
        return x * c + torch.cat((x2, x1), dim=-1) * s
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
