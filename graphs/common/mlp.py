"""The gated feed-forward of Llama, Qwen and Gemma decoders: ``down(act(gate(x)) * up(x))``.

Parameter names are the checkpoints' (``gate_proj``, ``up_proj``, ``down_proj``); :meth:`GatedMLP.fuse`
turns gate and up into one matmul after loading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mstar.layers.tensor_parallel import RowParallelLinear, column_parallel
from mstar.parallel.group import TPGroup
from mstar_graphs.common.fused_linear import fused_linear

Activation = Literal["silu", "gelu_tanh"]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,  # SwiGLU: Llama, Qwen
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GeGLU: Gemma
}


class GatedMLP(nn.Module):
    def __init__(
        self,
        hidden: int,
        inner: int,
        activation: Activation = "silu",
        *,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.act = ACTIVATIONS[activation]
        factory = {"dtype": dtype, "device": device}
        self.gate_proj = nn.Linear(hidden, inner, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden, inner, bias=bias, **factory)
        self.down_proj = nn.Linear(inner, hidden, bias=bias, **factory)

    def fuse(self) -> None:
        """One gate|up matmul instead of two (after loading: the checkpoint names are gone)."""
        self.gate_up_proj = fused_linear([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def shard(self, tp: TPGroup) -> None:
        """Keep this rank's slice of the inner width: gate and up column-parallel, down row-parallel
        (its output is all-reduced). Before :meth:`fuse`."""
        if hasattr(self, "gate_up_proj"):
            raise RuntimeError("shard the MLP before fusing its projections")
        self.gate_proj = column_parallel(self.gate_proj, tp, "intermediate_size")
        self.up_proj = column_parallel(self.up_proj, tp, "intermediate_size")
        self.down_proj = RowParallelLinear(self.down_proj, tp, "intermediate_size")  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "gate_up_proj"):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)
