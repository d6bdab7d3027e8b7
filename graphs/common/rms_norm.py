"""RMS norms of the decoder families: Llama / Qwen (scale by ``weight``) and Gemma (scale by ``1 + weight``)."""

from __future__ import annotations

import torch
from torch import nn


def rms_normalize(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """``xf / rms(xf)`` over the last axis (callers pass fp32: every checkpoint was trained so)."""
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """As Llama / Qwen checkpoints were trained with it: normalised in fp32, cast back, then the weight."""

    initial_weight = 1.0

    def __init__(
        self, size: int, eps: float, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), self.initial_weight, dtype=dtype, device=device))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalize(x.float(), self.eps).to(x.dtype)


class GemmaRMSNorm(RMSNorm):
    """Gemma's: the weight is an offset from 1, applied in fp32 before casting back (unlike Llama)."""

    initial_weight = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalize(x.float(), self.eps) * (1.0 + self.weight.float())).type_as(x)
