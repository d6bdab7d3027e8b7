"""pi0.5's action expert: a Gemma-300M-like stack over the H action rows, conditioned on flow time.

Time conditioning is adaRMSNorm (openpi ``pi0_pytorch.embed_suffix`` + its patched
``GemmaRMSNorm``): the flow time ``t`` -> sin|cos embedding (periods 4e-3 .. 4) ->
``time_mlp_in`` -> swish -> ``time_mlp_out`` -> swish = ``cond`` [B, width]. Every norm
of the expert is ``dense(cond)`` -> (scale, shift, gate): ``rms(x) * (1 + scale) + shift``,
and each residual branch is multiplied by its norm's gate. The noisy actions enter
through ``action_in_proj`` alone (pi0.5 has no state token: the state is text in the
prefix) and leave through ``action_out_proj`` as the velocity.

Each layer attends, through the engine, to the sequence's prefix KV of the same layer
index plus its own H rows; its K/V are written like any other rows'.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.attention.backend import AttentionContext
from mstar_graphs.common.rms_norm import rms_normalize
from mstar_graphs.pi05.config import Pi05Config
from mstar_graphs.pi05.gemma import gemma_attention, gemma_mlp


def time_embedding(time: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """time [B] -> [B, dim] = sin | cos of time * 2pi / period, periods geometric in [min, max].

    Computed in float64 and cast to fp32, as openpi does on devices that have float64.
    """
    if time.dim() != 1:
        raise ValueError(f"time must be [B], got shape {tuple(time.shape)}")
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    angles = (2 * math.pi / period)[None, :] * time[:, None].to(torch.float64)
    return torch.cat([angles.sin(), angles.cos()], dim=1).to(torch.float32)


class AdaRMSNorm(nn.Module):
    """RMSNorm modulated by ``cond``: returns (rms(x) * (1 + scale) + shift, gate)."""

    def __init__(self, size: int, cond_dim: int, eps: float, **factory: object) -> None:
        super().__init__()
        self.dense = nn.Linear(cond_dim, 3 * size, **factory)  # type: ignore[arg-type]
        self.eps = eps

    def modulation(self, cond: torch.Tensor) -> torch.Tensor:
        """cond [B, cond_dim] -> [B, 3 * size] (computed once per sequence, not per row)."""
        return self.dense(cond)

    def forward(self, x: torch.Tensor, modulation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, H, size]; modulation [B, 3 * size] -> (normed [B, H, size], gate [B, 1, size]).

        Each sequence's modulation broadcasts over its H rows (not gathered per row: on CPU the
        flow step of 8 robots spent ~2 ms per chunk copying 400-row scale/shift/gate tensors)."""
        scale, shift, gate = modulation[:, None].chunk(3, dim=-1)
        normed = rms_normalize(x.float(), self.eps) * (1.0 + scale.float()) + shift.float()
        return normed.to(x.dtype), gate.to(x.dtype)


class ExpertDecoderLayer(nn.Module):
    def __init__(self, config: Pi05Config, layer_idx: int, **factory: object) -> None:
        super().__init__()
        dims, eps = config.expert, config.rms_norm_eps
        self.input_layernorm = AdaRMSNorm(dims.width, dims.width, eps, **factory)
        self.self_attn = gemma_attention(dims, layer_idx, **factory)
        self.post_attention_layernorm = AdaRMSNorm(dims.width, dims.width, eps, **factory)
        self.mlp = gemma_mlp(dims, **factory)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        """x [B, H, width] (a sequence's rows together); cond [B, width]."""
        b, h, w = x.shape
        normed, gate = self.input_layernorm(x, self.input_layernorm.modulation(cond))
        x = x + self.self_attn(normed.view(b * h, w), cos, sin, attn).view(b, h, w) * gate
        normed, gate = self.post_attention_layernorm(x, self.post_attention_layernorm.modulation(cond))
        return x + self.mlp(normed.view(b * h, w)).view(b, h, w) * gate


class ExpertModel(nn.Module):
    """The expert's Gemma stack (``gemma_expert.model``: no token embeddings; adaRMS norms)."""

    def __init__(self, config: Pi05Config, **factory: object) -> None:
        super().__init__()
        width = config.expert.width
        self.layers = nn.ModuleList(ExpertDecoderLayer(config, i, **factory) for i in range(config.expert.depth))
        self.norm = AdaRMSNorm(width, width, config.rms_norm_eps, **factory)


class ActionExpert(nn.Module):
    """Velocity of the action flow for B sequences of H rows each (sequence-major)."""

    def __init__(self, config: Pi05Config, **factory: object) -> None:
        super().__init__()
        self.config = config
        width, action_dim = config.expert.width, config.action_dim
        self.model = ExpertModel(config, **factory)
        self.action_in_proj = nn.Linear(action_dim, width, **factory)  # type: ignore[arg-type]
        self.action_out_proj = nn.Linear(width, action_dim, **factory)  # type: ignore[arg-type]
        self.time_mlp_in = nn.Linear(width, width, **factory)  # type: ignore[arg-type]
        self.time_mlp_out = nn.Linear(width, width, **factory)  # type: ignore[arg-type]

    def condition(self, time: torch.Tensor) -> torch.Tensor:
        """Flow time [B] -> adaRMS condition [B, width]."""
        c = self.config
        emb = time_embedding(time, c.expert.width, c.min_period, c.max_period)
        emb = emb.to(device=self.time_mlp_in.bias.device, dtype=self.time_mlp_in.bias.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def forward(
        self, x: torch.Tensor, time: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        """x [B, H, A] noisy actions at ``time`` [B]; cos/sin [B*H, D] (``rotation_tables``) -> velocity
        [B, H, A] (fp32)."""
        b, h, a = x.shape
        if a != self.config.action_dim or time.shape != (b,):
            raise ValueError(
                f"flow_velocity needs x [B, H, {self.config.action_dim}] and time [B]; "
                f"got {tuple(x.shape)} and {tuple(time.shape)}"
            )
        like = self.action_in_proj.bias  # the module's device and dtype (the weight may be packed)
        cond = self.condition(time)
        hidden = self.action_in_proj(x.reshape(b * h, a).to(device=like.device, dtype=like.dtype))
        hidden = hidden.view(b, h, -1)
        for layer in self.model.layers:
            hidden = layer(hidden, cond, cos, sin, attn)
        hidden, _ = self.model.norm(hidden, self.model.norm.modulation(cond))  # the final gate is unused
        return self.action_out_proj(hidden.view(b * h, -1)).float().reshape(b, h, a)
