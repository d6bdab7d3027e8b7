"""The pre-norm decoder layer of Llama, Gemma and Qwen: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

The parts are built by the model (its norm, its attention options, a dense MLP or a mixture of
experts) and kept under the checkpoints' names, registered in the model's ``order``: that is the
order of its ``state_dict``, which tiny-checkpoint generators draw weights in and reports list
names in, so each model keeps its own.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar_graphs.common.attention import AttnFn, GQAttention

HF_ORDER = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")  # transformers' Llama / Qwen
DATAFLOW_ORDER = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")  # as forward uses them


class PreNormDecoderLayer(nn.Module):
    self_attn: GQAttention
    mlp: nn.Module
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module

    def __init__(
        self,
        self_attn: GQAttention,
        mlp: nn.Module,
        input_layernorm: nn.Module,
        post_attention_layernorm: nn.Module,
        order: tuple[str, ...] = HF_ORDER,
    ) -> None:
        super().__init__()
        parts = {
            "self_attn": self_attn,
            "mlp": mlp,
            "input_layernorm": input_layernorm,
            "post_attention_layernorm": post_attention_layernorm,
        }
        if sorted(order) != sorted(parts):
            raise ValueError(f"order must list {sorted(parts)} once each, got {order}")
        for name in order:
            setattr(self, name, parts[name])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttnFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))
