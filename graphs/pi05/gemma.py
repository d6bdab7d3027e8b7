"""pi0.5's prefix LM: PaliGemma's Gemma decoder over packed rows, attention through the engine.

Numerics follow transformers' Gemma (as openpi's PyTorch port uses it): RMSNorm scales
by ``1 + weight`` in fp32, the MLP is ``gelu_tanh(gate) * up``, rotate-half RoPE with
theta 10000, attention scale ``head_dim ** -0.5``. Text-token embeddings are
multiplied by sqrt(width) (the scale in the weight dtype, as transformers 5 does);
image rows arrive already in the LM's input space and are not scaled.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.attention.backend import AttentionContext
from mstar_graphs.common.attention import GQAttention
from mstar_graphs.common.decoder_layer import DATAFLOW_ORDER, PreNormDecoderLayer
from mstar_graphs.common.mlp import GatedMLP
from mstar_graphs.common.rms_norm import GemmaRMSNorm
from mstar_graphs.pi05.config import GemmaDims, Pi05Config


def gemma_attention(dims: GemmaDims, layer_idx: int, **factory: object) -> GQAttention:
    """q/k/v/o projections of one layer; ``layer_idx`` names the KV layer (the expert's layer i shares it)."""
    return GQAttention(dims.width, dims.num_heads, dims.num_kv_heads, dims.head_dim, layer_idx, **factory)  # type: ignore[arg-type]


def gemma_mlp(dims: GemmaDims, **factory: object) -> GatedMLP:
    return GatedMLP(dims.width, dims.mlp_dim, "gelu_tanh", **factory)  # type: ignore[arg-type]


def gemma_layer(dims: GemmaDims, eps: float, layer_idx: int, **factory: object) -> PreNormDecoderLayer:
    def norm() -> GemmaRMSNorm:
        return GemmaRMSNorm(dims.width, eps, **factory)  # type: ignore[arg-type]

    return PreNormDecoderLayer(
        gemma_attention(dims, layer_idx, **factory), gemma_mlp(dims, **factory), norm(), norm(), order=DATAFLOW_ORDER
    )  # pi0.5 always listed them so (shape_check reports in it)


class GemmaPrefixLM(nn.Module):
    """PaliGemma's ``language_model``: embeddings, decoder layers, final norm."""

    def __init__(self, config: Pi05Config, **factory: object) -> None:
        super().__init__()
        dims = config.prefix
        self.width = dims.width
        self.embed_tokens = nn.Embedding(config.vocab_size, dims.width, **factory)  # type: ignore[arg-type]
        self.layers = nn.ModuleList(gemma_layer(dims, config.rms_norm_eps, i, **factory) for i in range(dims.depth))
        self.norm = GemmaRMSNorm(dims.width, config.rms_norm_eps, **factory)  # type: ignore[arg-type]

    def embed(
        self, input_ids: torch.Tensor, embeds: torch.Tensor | None, embed_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Rows [T, width]: sqrt(width)-scaled token embeddings, or ``embeds`` where ``embed_mask``.

        ``embeds`` is either row-aligned [T, width] or packed [mask.sum(), width] (in row order).
        """
        weight = self.embed_tokens.weight
        if embeds is None:
            ids = input_ids
        else:
            if embed_mask is None or embed_mask.shape != input_ids.shape:
                raise ValueError(
                    f"embeds need embed_mask [T] = {tuple(input_ids.shape)}, got "
                    f"{None if embed_mask is None else tuple(embed_mask.shape)}"
                )
            embed_mask = embed_mask.to(torch.bool)
            ids = input_ids.masked_fill(embed_mask, 0)  # placeholder ids never index the table
        scale = torch.tensor(math.sqrt(self.width), dtype=weight.dtype, device=weight.device)
        h = F.embedding(ids, weight) * scale
        if embeds is None:
            return h
        n, marked = input_ids.shape[0], int(embed_mask.sum())
        if embeds.dim() != 2 or embeds.shape[1] != self.width or embeds.shape[0] not in (n, marked):
            raise ValueError(f"embeds must be [{n} or {marked}, {self.width}], got {tuple(embeds.shape)}")
        rows = embeds.to(device=h.device, dtype=h.dtype)
        if rows.shape[0] == n:
            return torch.where(embed_mask[:, None], rows, h)
        h = h.clone()
        h[embed_mask] = rows
        return h

    def forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext, kv_only: bool = False
    ) -> torch.Tensor:
        """Final-normed hidden states; with ``kv_only`` only each layer's K/V matter (written
        through ``attn``), so the last layer stops after its attention and nothing is normed."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if kv_only and i == last:
                layer.self_attn(layer.input_layernorm(h), cos, sin, attn)
                return h
            h = layer(h, cos, sin, attn)
        return self.norm(h)
