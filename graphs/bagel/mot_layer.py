"""BAGEL's Mixture-of-Transformers decoder layer: two weight sets, one shared attention.

Every weight of a Qwen2 layer has a ``_moe_gen`` twin. A row uses the generation set iff it is a
VAE latent token (a clean context image or the image being generated); text, image-span markers
and ViT rows use the understanding set. Both sets' rows attend jointly over one K/V sequence: each
row is projected (q/k/v with bias, per-head q/k RMSNorm) with its own set, the rows are put back in
order, RoPE'd, and the engine's ``attn`` is called once; then o_proj, the post-attention norm and
the SiLU MLP are again per set. Pre-norm and residual as in Qwen2.

Names are the checkpoint's (``self_attn.q_proj``, ``self_attn.q_proj_moe_gen``, ``self_attn.q_norm_moe_gen``,
``mlp_moe_gen.gate_proj``, ``input_layernorm_moe_gen`` ...), so weights load by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mstar_graphs.bagel.config import LlmConfig
from mstar_graphs.common.attention import AttnFn
from mstar_graphs.common.mlp import GatedMLP
from mstar_graphs.common.rms_norm import RMSNorm
from mstar_graphs.common.rope import apply_rope

GEN = "_moe_gen"  # the generation set's suffix on module names
SETS = ("", GEN)  # understanding, generation


@dataclass(frozen=True)
class RowSplit:
    """Which rows of a step use which weight set: ``und`` and ``gen`` are row indexes [n] int64."""

    und: torch.Tensor
    gen: torch.Tensor
    total: int

    @classmethod
    def from_mask(cls, gen_rows: torch.Tensor | None) -> RowSplit | None:
        """``gen_rows`` [T] bool -> the split, or None when no row is a generation row (the fast path)."""
        if gen_rows is None or not bool(gen_rows.any()):
            return None
        gen_rows = gen_rows.to(torch.bool)
        return cls(
            und=(~gen_rows).nonzero().squeeze(1), gen=gen_rows.nonzero().squeeze(1), total=int(gen_rows.shape[0])
        )

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.index_select(0, self.und), x.index_select(0, self.gen)

    def merge(self, und: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
        out = und.new_empty((self.total, *und.shape[1:]))
        out.index_copy_(0, self.und, und)
        out.index_copy_(0, self.gen, gen)
        return out


class MoTAttention(nn.Module):
    """q/k/v (with bias), o (no bias), q/k norms, once per set; attention itself is the caller's."""

    def __init__(self, cfg: LlmConfig, layer_idx: int, **factory: object) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.scale = self.head_dim**-0.5
        hidden, q_width, kv_width = cfg.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        for s in SETS:
            setattr(self, f"q_proj{s}", nn.Linear(hidden, q_width, bias=True, **factory))  # type: ignore[arg-type]
            setattr(self, f"k_proj{s}", nn.Linear(hidden, kv_width, bias=True, **factory))  # type: ignore[arg-type]
            setattr(self, f"v_proj{s}", nn.Linear(hidden, kv_width, bias=True, **factory))  # type: ignore[arg-type]
            setattr(self, f"o_proj{s}", nn.Linear(q_width, hidden, bias=False, **factory))  # type: ignore[arg-type]
            setattr(self, f"q_norm{s}", RMSNorm(self.head_dim, cfg.rms_norm_eps, **factory))  # type: ignore[arg-type]
            setattr(self, f"k_norm{s}", RMSNorm(self.head_dim, cfg.rms_norm_eps, **factory))  # type: ignore[arg-type]

    def project(self, x: torch.Tensor, s: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed rows [n, hidden] of set ``s`` -> q [n, heads, D], k, v [n, kv_heads, D]; q, k normed, not rotated."""
        n, d = x.shape[0], self.head_dim
        q = getattr(self, f"q_proj{s}")(x).reshape(n, self.num_heads, d)
        k = getattr(self, f"k_proj{s}")(x).reshape(n, self.num_kv_heads, d)
        v = getattr(self, f"v_proj{s}")(x).reshape(n, self.num_kv_heads, d)
        return getattr(self, f"q_norm{s}")(q), getattr(self, f"k_norm{s}")(k), v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttnFn
    ) -> torch.Tensor:
        """Rows in step order: RoPE, then the one attention call of this layer -> [T, heads * D]."""
        out = attn(self.layer_idx, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


class MoTDecoderLayer(nn.Module):
    def __init__(self, cfg: LlmConfig, layer_idx: int, **factory: object) -> None:
        super().__init__()
        self.self_attn = MoTAttention(cfg, layer_idx, **factory)
        for s in SETS:
            setattr(self, f"mlp{s}", GatedMLP(cfg.hidden_size, cfg.intermediate_size, "silu", **factory))  # type: ignore[arg-type]
            setattr(self, f"input_layernorm{s}", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory))  # type: ignore[arg-type]
            setattr(self, f"post_attention_layernorm{s}", RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory))  # type: ignore[arg-type]

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttnFn,
        rows: RowSplit | None = None,
        kv_only: bool = False,
        keep: tuple[torch.Tensor, RowSplit | None] | None = None,
    ) -> torch.Tensor:
        """x [T, hidden] in step order; cos, sin [T, D] (``rotation_tables``; half tables also do); ``rows``
        None: every row is an understanding row. ``kv_only``: stop after the attention call (its K/V are
        written; the result is unused).
        ``keep`` (row indexes [K], their split): every row's K/V is written, but only those rows go on
        through o_proj and the MLP -> [K, hidden] (a row's result does not depend on the others')."""
        if rows is None:
            q, k, v = self.self_attn.project(self.input_layernorm(x), "")
        else:
            parts = rows.split(x)
            und, gen = (self.self_attn.project(getattr(self, f"input_layernorm{s}")(p), s) for s, p in zip(SETS, parts))
            q, k, v = (rows.merge(a, b) for a, b in zip(und, gen))
        out = self.self_attn.attend(q, k, v, cos, sin, attn)
        if kv_only:
            return x
        if keep is not None:
            index, rows = keep
            x, out = x.index_select(0, index), out.index_select(0, index)
        if rows is None:
            return self._finish(x, out, "")
        parts, out_parts = rows.split(x), rows.split(out)
        return rows.merge(*(self._finish(p, o, s) for s, p, o in zip(SETS, parts, out_parts)))

    def _finish(self, x: torch.Tensor, attn_out: torch.Tensor, s: str) -> torch.Tensor:
        """Set ``s``'s o_proj + residual, then its post-attention norm, MLP and residual."""
        h = x + getattr(self.self_attn, f"o_proj{s}")(attn_out)
        return h + getattr(self, f"mlp{s}")(getattr(self, f"post_attention_layernorm{s}")(h))
