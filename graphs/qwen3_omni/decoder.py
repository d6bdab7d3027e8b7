"""The Qwen3 decoder stack of the Thinker, the Talker and the code predictor.

Pre-norm layers: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``. Attention has per-head RMSNorm
on q and k before RoPE (Qwen3), grouped-query heads, no bias. The feed-forward is a
:class:`~mstar_graphs.qwen3_omni.moe.SparseMoE` (Thinker, Talker: with a shared expert) or a
dense SwiGLU (code predictor). Attention goes through the caller's ``attn(layer, q, k, v, scale)``
(the AR engine's paged KV, or a dense cache for the code predictor), so nothing here knows
about batches or KV.

For text and audio the Thinker's and Talker's M-RoPE has the same position on its three axes,
which makes it exactly 1-D RoPE; :func:`mrope_cos_sin` also computes the interleaved t/h/w layout
the reference uses for images.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mstar.engine.ar_module import ARModule
from mstar.engine.kv_cache import KVSpec
from mstar_graphs.common.attention import AttnFn, GQAttention
from mstar_graphs.common.decoder_layer import PreNormDecoderLayer
from mstar_graphs.common.mlp import GatedMLP
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.common.rope import rope_inv_freq
from mstar_graphs.qwen3_omni.config import TextConfig
from mstar_graphs.qwen3_omni.moe import SparseMoE


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D RoPE: positions [T] -> cos, sin [T, head_dim/2] (fp32 angles, cast like the reference)."""
    angles = positions.float()[:, None] * rope_inv_freq(head_dim, theta).to(positions.device)[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def mrope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, section: list[int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved M-RoPE: positions [3, T] (t, h, w) -> cos, sin [T, head_dim/2]. Frequency j
    takes h if j % 3 == 1 and j < 3 * section[1], w if j % 3 == 2 and j < 3 * section[2], else t."""
    freqs = positions.float()[..., None] * rope_inv_freq(head_dim, theta).to(positions.device)  # [3, T, D/2]
    j = torch.arange(head_dim // 2, device=positions.device)
    axis = torch.zeros_like(j)
    axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
    angles = freqs.gather(0, axis[None, None, :].expand(1, freqs.shape[1], -1))[0]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def decoder_layer(cfg: TextConfig, layer_idx: int, moe: bool, **factory) -> PreNormDecoderLayer:
    attention = GQAttention(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.dim_per_head,
        layer_idx,
        bias=cfg.attention_bias,
        qk_norm_eps=cfg.rms_norm_eps,
        **factory,
    )
    if moe:
        mlp: nn.Module = SparseMoE(
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts,
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
            cfg.shared_expert_intermediate_size,
            **factory,
        )
    else:
        mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, **factory)
    return PreNormDecoderLayer(
        attention,
        mlp,
        RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory),
        RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory),
    )


class DecoderStack(nn.Module):
    """``layers`` and the final ``norm`` (the checkpoint's ``model.`` prefix, less its embeddings)."""

    def __init__(self, cfg: TextConfig, moe_layers: Callable[[int], bool], **factory) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            decoder_layer(cfg, i, moe_layers(i), **factory) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)

    def fuse_experts(self) -> None:
        for layer in self.layers:
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.fuse()

    def run(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttnFn,
        capture: int | None = None,
        deepstack: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> (final-normed hidden, the hidden after ``capture`` layers (0: the input) or None).
        ``deepstack`` (rows mask [T], features [D, rows, H]): feature i is added at the masked rows
        after layer i (an image's deepstack rows, as the reference adds them)."""
        captured = h if capture == 0 else None
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, attn)
            if capture == i + 1:  # the layer's own output: the reference records it before the deepstack add
                captured = h
            if deepstack is not None and i < deepstack[1].shape[0]:
                h = h.clone()
                h[deepstack[0]] = h[deepstack[0]] + deepstack[1][i].to(h.dtype)
        return self.norm(h), captured


class DecoderARModule(ARModule):
    """What the Thinker and the Talker share as AR engine modules: a :class:`DecoderStack` ``model`` over
    ``text`` (the config), rows from an embedding table or, where ``embed_mask`` marks them, given."""

    text: TextConfig
    model: DecoderStack
    accepts_rope_positions = True  # M-RoPE (t, h, w) positions of prompts with images
    tp_size: int = 1  # tensor-parallel shards: this rank's KV holds its share of the KV heads

    def kv_spec(self) -> KVSpec:
        return KVSpec(
            num_layers=self.text.num_hidden_layers,
            num_kv_heads=self.text.num_key_value_heads // self.tp_size,
            head_dim=self.text.dim_per_head,
        )

    @property
    def vocab_size(self) -> int:
        return self.text.vocab_size

    @property
    def max_positions(self) -> int:
        return self.text.max_position_embeddings

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def fuse_experts(self):
        self.model.fuse_experts()
        return self

    @staticmethod
    def rows(
        table: nn.Embedding, input_ids: torch.Tensor, embeds: torch.Tensor | None, embed_mask: torch.Tensor | None
    ) -> torch.Tensor:
        h = table(input_ids)
        if embeds is not None and embed_mask is not None and bool(embed_mask.any()):
            h = h.clone()
            h[embed_mask] = embeds[embed_mask].to(h.dtype)
        return h

    def cos_sin(
        self, positions: torch.Tensor, rope_positions: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """1-D RoPE from the engine's positions, or interleaved M-RoPE from a request's ``rope_positions`` [3, T]."""
        if rope_positions is None:
            return rope_cos_sin(positions, self.text.dim_per_head, self.text.theta, dtype)
        rope = self.text.rope_parameters
        if rope is None or rope.mrope_section is None or rope_positions.shape[0] != 3:
            raise ValueError("rope_positions need an M-RoPE model (rope_parameters.mrope_section) and 3 axes")
        return mrope_cos_sin(rope_positions, self.text.dim_per_head, self.text.theta, rope.mrope_section, dtype)

    def _positions_check(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be [T]; got {tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
