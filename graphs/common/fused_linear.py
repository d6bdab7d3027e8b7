"""Several linears over the same input as one wider matmul (for serving, after loading by checkpoint names)."""

from __future__ import annotations

import torch
from torch import nn


def fused_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One linear whose output is the parts' outputs side by side (rows concatenated)."""
    weight = torch.cat([p.weight.detach() for p in parts], dim=0)
    has_bias = parts[0].bias is not None
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if has_bias:
            fused.bias.copy_(torch.cat([p.bias.detach() for p in parts]))
    return fused
