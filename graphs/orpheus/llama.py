"""Orpheus's LLM: a Llama decoder as an :class:`ARModule` the AR engine drives.

Parameter names are exactly the HF checkpoint names, so ``mstar.weights.load_weights``
maps them 1:1. The engine hands ``forward`` the packed tokens of a whole step (any
mix of sequences, prefill and decode), so nothing here knows about batches or KV:
attention goes through the engine's ``attn(layer, q, k, v, scale)``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionContext
from mstar.engine.kv_cache import KVSpec
from mstar.layers.tensor_parallel import (
    ParallelLMHead,
    VocabParallelEmbedding,
    check_divisible,
    restricted_logits,
    vocab_slice,
)
from mstar.parallel.group import TPGroup
from mstar.weights import load_weights, no_random_init
from mstar_graphs.common.attention import GQAttention
from mstar_graphs.common.decoder_layer import PreNormDecoderLayer
from mstar_graphs.common.mlp import GatedMLP
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.common.rope import register_rope_tables, rope_inv_freq, rope_tables, rotation_tables
from mstar_graphs.orpheus.config import LlamaConfig


def llama_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse RoPE frequencies [head_dim/2] in fp32, with linear or llama3 scaling applied."""
    inv_freq = rope_inv_freq(cfg.dim_per_head, cfg.rope_base)
    scaling = cfg.rope_scaling_params()
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if cfg.rope_type == "linear":
        return inv_freq / factor
    # llama3: long wavelengths (beyond the pretraining context / low_freq_factor) are
    # slowed down by `factor`, short ones kept, and the band between blended linearly
    # in 1/wavelength so the spectrum stays continuous.
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def llama_layer(cfg: LlamaConfig, layer_idx: int, **factory: object) -> PreNormDecoderLayer:
    def norm() -> RMSNorm:
        return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)  # type: ignore[arg-type]

    attention = GQAttention(
        cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head, layer_idx, **factory
    )  # type: ignore[arg-type]
    mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, "silu", **factory)  # type: ignore[arg-type]
    return PreNormDecoderLayer(attention, mlp, norm(), norm())


class LlamaModel(nn.Module):
    """The ``model.`` prefix of the HF names: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: LlamaConfig, **factory: object) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)  # type: ignore[arg-type]
        self.layers = nn.ModuleList(llama_layer(cfg, i, **factory) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)  # type: ignore[arg-type]


class LlamaForCausalLM(ARModule):
    """Llama decoder + LM head. ``forward`` returns final-normed hidden states; logits come
    from :meth:`compute_logits` so the engine computes them only for the rows it samples.

    With ``tp`` (size > 1) the module is built and loaded whole, then :meth:`shard_for_tp`
    (``from_pretrained_dir`` calls it) keeps this rank's heads, MLP features and vocabulary
    slice; every rank then runs the same forward, with collectives inside.
    """

    plain_linears = ("lm_head",)  # compute_logits reads row ranges of its weight
    quantizable_heads = ("lm_head",)  # ... through restricted_logits, which reads a quantized head too

    def __init__(
        self,
        config: LlamaConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        tp: TPGroup | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.tp = tp or TPGroup.single()
        self.sharded = self.tp.size == 1
        check_divisible(
            self.tp,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.kv_heads,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
        )
        factory = {"dtype": dtype, "device": device}
        self.model = LlamaModel(config, **factory)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)  # type: ignore[arg-type]
        self._tie()
        self._reset_rope(device)

    def _tie(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _reset_rope(self, device: torch.device | str | None) -> None:
        cos, sin = rope_tables(llama_inv_freq(self.config), self.config.max_position_embeddings)
        register_rope_tables(self, cos, sin, self.model.norm.weight.dtype, device)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained_dir(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = True, tp: TPGroup | None = None
    ) -> LlamaForCausalLM:
        """Config + module + weights from an HF checkpoint directory, on CPU in ``dtype``;
        with ``tp``, this rank's shard (the whole checkpoint is read, then sliced)."""
        config = LlamaConfig.from_dir(path)
        # Build on the meta device and materialise without random init: the 3B model's
        # default init alone would take longer than reading its weights.
        with no_random_init():
            module = cls(config, dtype=dtype, device="meta", tp=tp)
        module.to_empty(device="cpu")
        module._tie()
        module._reset_rope("cpu")
        load_weights(module, path, dtype=dtype, progress=progress, desc=f"LLM {Path(path).name}")
        return module.shard_for_tp().eval()

    def shard_for_tp(self) -> LlamaForCausalLM:
        """Slice the loaded full weights down to this rank's shard (once; before fusing)."""
        if self.sharded:
            return self
        tp = self.tp
        for layer in self.model.layers:  # heads and MLP features: column- then row-parallel
            layer.self_attn.shard(tp)
            layer.mlp.shard(tp)
        size = self.config.vocab_size
        embed, start = vocab_slice(self.model.embed_tokens.weight, tp)
        self.model.embed_tokens = VocabParallelEmbedding(embed, start, size, tp)
        head = embed if self.config.tie_word_embeddings else vocab_slice(self.lm_head.weight, tp)[0]
        self.lm_head = ParallelLMHead(head, start, size, tp)
        self.sharded = True
        return self

    def fuse_projections(self) -> LlamaForCausalLM:
        """For serving: fewer, wider matmuls per layer (q|k|v and gate|up). Loading by
        checkpoint names must happen before this."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    # ----------------------------------------------------------- ARModule API

    def kv_spec(self) -> KVSpec:
        c = self.config
        kv_heads = c.kv_heads // self.tp.size  # this rank's heads: its paged KV holds only those
        return KVSpec(num_layers=c.num_hidden_layers, num_kv_heads=kv_heads, head_dim=c.dim_per_head)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,  # type: ignore[override]
        attn: AttentionContext,
    ) -> torch.Tensor:
        """input_ids, positions: [T] int64 (packed step tokens) -> final-normed hidden [T, H]."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be [T]; got {tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        cos, sin = rotation_tables(self.rope_cos.index_select(0, positions), self.rope_sin.index_select(0, positions))
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin, attn)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [B, H] -> logits [B, V], or [B, K] over just the vocabulary rows ``token_ids`` [K].

        Restricting first is what makes constrained decoding cheap: the real head is
        156940 x 3072, while one Orpheus slot allows only 4096 (+1) tokens. Under TP every
        rank must call this with the same arguments (the head is vocabulary-parallel).
        """
        if isinstance(self.lm_head, ParallelLMHead):
            return self.lm_head(hidden, token_ids)
        return restricted_logits(hidden, self.lm_head, token_ids)
