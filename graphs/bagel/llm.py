"""``BagelLLM``: BAGEL's Qwen2 Mixture-of-Transformers language model as an AR module.

Engine contract (``mstar.engine.ar_module``), plus what BAGEL needs:

- ``forward(input_ids, positions, attn, embeds=None, embed_mask=None, rope_positions=None,
  row_kinds=None, need_hidden=True) -> [T, hidden]``: rows where ``embed_mask`` is set take the
  first ``hidden`` columns of ``embeds`` (ViT rows, embedded latent tokens) instead of the token's
  embedding; ``row_kinds`` 1 marks a generation row (a VAE latent token: the ``_moe_gen`` weights),
  0 an understanding row. The output is final-normed per row kind (``norm`` / ``norm_moe_gen``).
- RoPE angles come from ``rope_positions`` [1, T] when given: BAGEL's positions are a per-context
  counter (an image span's rows share one position) while ``positions`` index the KV.
- ``compute_logits`` (untied ``lm_head``) for understanding rows; ``velocity_head`` (``llm2vae``)
  for generation rows: the flow velocity of a latent token.

Module names follow ``ema.safetensors`` under ``language_model.`` (``model.embed_tokens``,
``model.layers.N``, ``model.norm``, ``model.norm_moe_gen``, ``lm_head``) plus ``llm2vae``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionContext
from mstar.engine.kv_cache import KVSpec
from mstar.layers.tensor_parallel import restricted_logits
from mstar.weights import no_random_init
from mstar_graphs.bagel.config import BagelConfig, BagelDims, LlmConfig
from mstar_graphs.bagel.mot_layer import MoTDecoderLayer, RowSplit
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.common.rope import register_rope_tables, rope_inv_freq, rope_tables, rotation_tables

GEN_ROW = 1  # row_kinds value of a generation (VAE latent) row; 0: understanding


class BagelDecoder(nn.Module):
    """``language_model.model``: token embeddings, MoT layers, one final norm per weight set."""

    def __init__(self, cfg: LlmConfig, **factory: object) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **factory)  # type: ignore[arg-type]
        self.layers = nn.ModuleList(MoTDecoderLayer(cfg, i, **factory) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)  # type: ignore[arg-type]
        self.norm_moe_gen = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)  # type: ignore[arg-type]


class BagelLLM(ARModule):
    accepts_rope_positions = True
    accepts_row_kinds = True
    accepts_need_hidden = True  # a prefill nothing is sampled from computes only its KV
    accepts_hidden_rows = True  # a prefill's last layer finishes only the rows that are sampled

    def __init__(
        self,
        cfg: LlmConfig,
        dims: BagelDims | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.config = cfg.validated()
        self.dims = dims or BagelDims()
        factory = {"dtype": dtype, "device": device}
        self.model = BagelDecoder(cfg, **factory)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory)  # type: ignore[arg-type]
        self.llm2vae = nn.Linear(cfg.hidden_size, self.dims.latent_token_dim, **factory)  # type: ignore[arg-type]
        self.reset_rope(device)

    def reset_rope(self, device: torch.device | str | None) -> None:
        """(Re)build the RoPE tables: non-persistent, so a meta build or a load needs this."""
        c = self.config
        cos, sin = rope_tables(rope_inv_freq(c.head_dim, c.rope_theta), c.max_position_embeddings)
        register_rope_tables(self, cos, sin, self.model.norm.weight.dtype, device)

    @classmethod
    def from_pretrained_dir(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = False
    ) -> BagelLLM:
        """Config + the LLM's weights (``language_model.*``, ``llm2vae.*`` of ``ema.safetensors``) from a
        released BAGEL directory, on CPU in ``dtype``."""
        from mstar_graphs.bagel.checkpoints import check_layout, load_llm_weights

        check_layout(path)
        config = BagelConfig.from_dir(path)
        with no_random_init():
            module = cls(config.llm, config.dims, dtype=dtype, device="meta")
        module.to_empty(device="cpu")
        module.reset_rope("cpu")
        load_llm_weights(module, path, dtype=dtype, progress=progress)
        return module.eval()

    # ----------------------------------------------------------- ARModule API

    def kv_spec(self) -> KVSpec:
        c = self.config
        return KVSpec(num_layers=c.num_hidden_layers, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def embed(
        self, input_ids: torch.Tensor, embeds: torch.Tensor | None, embed_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """[T, hidden]: token embeddings, or the first ``hidden`` columns of ``embeds`` [T, W] where ``embed_mask``."""
        weight = self.model.embed_tokens.weight
        if embeds is None:
            return F.embedding(input_ids, weight)
        n, hidden = input_ids.shape[0], self.hidden_size
        if embed_mask is None or embed_mask.shape != input_ids.shape:
            raise ValueError(
                f"embeds need embed_mask [T] = {tuple(input_ids.shape)}, got "
                f"{None if embed_mask is None else tuple(embed_mask.shape)}"
            )
        if embeds.dim() != 2 or embeds.shape[0] != n or embeds.shape[1] < hidden:
            raise ValueError(f"embeds must be [{n}, >= {hidden}] (row-aligned), got {tuple(embeds.shape)}")
        mask = embed_mask.to(torch.bool)
        h = F.embedding(input_ids.masked_fill(mask, 0), weight)  # placeholder ids never index the table
        return torch.where(mask[:, None], embeds[:, :hidden].to(device=h.device, dtype=h.dtype), h)

    def _rope(self, positions: torch.Tensor, rope_positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if rope_positions is not None:
            if rope_positions.dim() != 2 or rope_positions.shape != (1, positions.shape[0]):
                raise ValueError(
                    f"rope_positions must be [1, T] = [1, {positions.shape[0]}] (BAGEL's RoPE has one axis), "
                    f"got {tuple(rope_positions.shape)}"
                )
            positions = rope_positions[0]
        # no bounds check (it would sync every step): index_select fails loudly past the tables
        # full-width tables, built once per forward: each layer's rotation then takes fewer ops
        return rotation_tables(self.rope_cos.index_select(0, positions), self.rope_sin.index_select(0, positions))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,  # type: ignore[override]
        attn: AttentionContext,
        embeds: torch.Tensor | None = None,
        embed_mask: torch.Tensor | None = None,
        rope_positions: torch.Tensor | None = None,
        row_kinds: torch.Tensor | None = None,
        need_hidden: bool = True,
        hidden_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] int64; embeds [T, W >= hidden] + embed_mask [T] bool; rope_positions
        [1, T] int64; row_kinds [T] int64 (1: generation row) -> final-normed hidden [T, hidden]. With
        ``need_hidden=False`` only the KV is computed and the result is unused; with ``hidden_rows`` [K]
        int64 only those rows' hidden states are returned ([K, hidden]): the last layer's o_proj and MLP
        (a quarter of a 4-layer prefill's MLP work) run on them alone."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be [T]; got {tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        if row_kinds is not None and row_kinds.shape != input_ids.shape:
            raise ValueError(f"row_kinds must be [T] = {tuple(input_ids.shape)}, got {tuple(row_kinds.shape)}")
        rows = RowSplit.from_mask(None if row_kinds is None else row_kinds == GEN_ROW)
        cos, sin = self._rope(positions, rope_positions)
        h = self.embed(input_ids, embeds, embed_mask)
        last = len(self.model.layers) - 1
        for layer in self.model.layers[:last]:
            h = layer(h, cos, sin, attn, rows)
        if not need_hidden:
            return self.model.layers[last](h, cos, sin, attn, rows, kv_only=True)
        if hidden_rows is not None:
            kept = None if rows is None else RowSplit.from_mask((row_kinds == GEN_ROW).index_select(0, hidden_rows))
            h = self.model.layers[last](h, cos, sin, attn, rows, keep=(hidden_rows, kept))
            rows = kept
        else:
            h = self.model.layers[last](h, cos, sin, attn, rows)
        if rows is None:
            return self.model.norm(h)
        und, gen = rows.split(h)
        return rows.merge(self.model.norm(und), self.model.norm_moe_gen(gen))

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [B, hidden] of understanding rows -> logits [B, V] (or [B, K] for ``token_ids`` [K])."""
        return restricted_logits(hidden, self.lm_head.weight, token_ids)

    def velocity_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] of generation rows -> flow velocity [N, p * p * C] (``llm2vae``)."""
        return self.llm2vae(hidden)
