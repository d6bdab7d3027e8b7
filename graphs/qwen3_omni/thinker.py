"""The Thinker: Qwen3-Omni's MoE LLM as an :class:`ARModule` the AR engine drives.

Token embeddings, or, where the engine marks rows (``embed_mask``), the audio encoder's embeddings
in their place (the prompt's ``<|audio_pad|>`` tokens); MoE decoder layers; the LM head. Text and
audio positions are the same on M-RoPE's three axes, so the engine's 1-D positions are the
positions; a prompt with images gives its (t, h, w) positions (``rope_positions``), and an
image's rows carry its deepstack features, added to the hidden states after the first layers.
``capture_layer`` keeps the hidden state after that many layers of the last forward (the Talker
reads layer ``accept_hidden_layer`` at the prompt's audio and image rows).

Module names are the checkpoint's under ``thinker.`` (``model.embed_tokens``, ``model.layers.N``,
``model.norm``, ``lm_head``), with the experts fused after loading.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.engine.attention.backend import AttentionContext
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.decoder import DecoderARModule, DecoderStack


class Thinker(DecoderARModule):
    plain_linears = ("lm_head",)  # compute_logits reads row ranges of its weight
    row_outputs = ("rows",)  # per row: [input embedding | hidden after accept_hidden_layer] (the Talker's inputs)

    def __init__(
        self, config: Qwen3OmniConfig, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.config = config
        text = config.thinker_config.text_config
        self.text = text
        factory = {"dtype": dtype, "device": device}
        self.model = DecoderStack(text, text.is_moe_layer, **factory)
        self.model.embed_tokens = nn.Embedding(text.vocab_size, text.hidden_size, **factory)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False, **factory)
        self.capture_layer: int | None = config.talker_config.accept_hidden_layer
        self.captured: torch.Tensor | None = None  # [T, H] of the last forward, after capture_layer layers
        self.embedded: torch.Tensor | None = None  # [T, H]: the last forward's input embeddings

    def embed(
        self, input_ids: torch.Tensor, embeds: torch.Tensor | None = None, embed_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.rows(self.model.embed_tokens, input_ids, embeds, embed_mask)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,  # type: ignore[override]
        attn: AttentionContext,
        embeds: torch.Tensor | None = None,
        embed_mask: torch.Tensor | None = None,
        rope_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T]; embeds [T, H * (1 + D)] with embed_mask [T] (an image's rows carry D
        deepstack features after the embedding; audio rows none, or zeros); rope_positions [3, T] for
        M-RoPE (a prompt with images) -> final-normed hidden [T, H]."""
        self._positions_check(input_ids, positions)
        hidden = self.text.hidden_size
        deepstack = None
        if embeds is not None and embeds.shape[1] > hidden:
            if embeds.shape[1] % hidden:
                raise ValueError(f"embeds of width {embeds.shape[1]} are not whole rows of {hidden}")
            if embed_mask is not None and bool(embed_mask.any()):
                rows = embeds[embed_mask, hidden:]
                deepstack = (embed_mask, rows.reshape(rows.shape[0], -1, hidden).transpose(0, 1))
            embeds = embeds[:, :hidden]
        h = self.embed(input_ids, embeds, embed_mask)
        self.embedded = h
        cos, sin = self.cos_sin(positions, rope_positions, h.dtype)
        out, self.captured = self.model.run(h, cos, sin, attn, capture=self.capture_layer, deepstack=deepstack)
        self.rows_out = {"rows": torch.cat([h, self.captured], dim=-1)}
        return out

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.tp_size > 1:  # a ParallelLMHead: every rank computes its vocabulary slice
            return self.lm_head(hidden, token_ids)
        if token_ids is None:
            return self.lm_head(hidden)
        return hidden @ self.lm_head.weight.index_select(0, token_ids).T
