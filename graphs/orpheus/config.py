"""The Llama config of Orpheus's LLM, read from a Hugging Face ``config.json``.

Field names are HF ``LlamaConfig``'s so a downloaded checkpoint's config reads as is;
unknown fields are ignored (real configs carry many we do not need).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from mstar_graphs.common.config_loader import (
    FieldError,
    JsonConfig,
    decode_json,
    field_error,
    require_divides,
    require_dtype,
    require_finite_positive,
    require_positive,
)

# RoPE variants we implement; anything else must fail loudly rather than give wrong positions.
ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class LlamaConfig(msgspec.Struct, JsonConfig, kw_only=True):
    checkpoint = "an HF checkpoint directory"

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None  # None: plain multi-head attention
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float | None = None  # transformers 5 may keep it in rope_parameters instead
    rope_scaling: dict[str, Any] | None = None  # transformers 4 spelling
    rope_parameters: dict[str, Any] | None = None  # transformers 5 spelling
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None
    dtype: str | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | list[int] | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | list[int] | None = None
    model_type: str | None = None

    # ----------------------------------------------------------------- reading

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> LlamaConfig:
        return decode_json(data, cls, source)._resolved(source)

    def to_dict(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    # ---------------------------------------------------------------- derived

    @property
    def kv_heads(self) -> int:
        assert self.num_key_value_heads is not None  # set by _resolved
        return self.num_key_value_heads

    @property
    def dim_per_head(self) -> int:
        assert self.head_dim is not None  # set by _resolved
        return self.head_dim

    @property
    def rope_base(self) -> float:
        """The RoPE theta, wherever the file put it (top level or inside rope_parameters)."""
        if self.rope_theta is not None:
            return float(self.rope_theta)
        params = self.rope_parameters or {}
        return float(params.get("rope_theta", 10000.0))

    @property
    def rope_type(self) -> str:
        params = self._rope_dict()
        if not params:
            return "default"
        return str(params.get("rope_type", params.get("type", "default")))

    def rope_scaling_params(self) -> dict[str, float] | None:
        """The scaling numbers of a non-default RoPE (as floats), or None for plain RoPE."""
        kind = self.rope_type
        if kind == "default":
            return None
        params = self._rope_dict()
        if kind == "linear":
            return {"factor": float(params["factor"])}
        out = {k: float(params[k]) for k in _LLAMA3_KEYS if k in params}
        # as in HF: a llama3 dict without the pretraining length means max_position_embeddings
        out.setdefault("original_max_position_embeddings", float(self.max_position_embeddings))
        return out

    @property
    def torch_dtype_name(self) -> str | None:
        """The checkpoint's stored dtype ("bfloat16", ...) under either spelling."""
        return self.dtype or self.torch_dtype

    # ------------------------------------------------------------- validation

    def _rope_dict(self) -> dict[str, Any]:
        # transformers 5 writes rope_parameters (maybe with rope_type "default" and just theta);
        # older files write rope_scaling. rope_scaling wins when both describe a scaling.
        if self.rope_scaling:
            return self.rope_scaling
        return self.rope_parameters or {}

    def _resolved(self, source: str) -> LlamaConfig:
        bad = field_error(source)
        require_positive(
            bad,
            self,
            (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "max_position_embeddings",
            ),
        )
        heads = self.num_attention_heads
        kv_heads = heads if self.num_key_value_heads is None else self.num_key_value_heads
        if kv_heads <= 0:
            raise bad("num_key_value_heads", f"must be > 0, got {kv_heads}")
        require_divides(bad, "num_key_value_heads", kv_heads, "num_attention_heads", heads)
        if self.head_dim is None:
            if self.hidden_size % heads:
                raise bad("hidden_size", f"{self.hidden_size} is not divisible by num_attention_heads={heads}")
            head_dim = self.hidden_size // heads
        else:
            head_dim = self.head_dim
        if head_dim <= 0 or head_dim % 2:
            raise bad("head_dim", f"must be a positive even number (RoPE rotates pairs), got {head_dim}")
        require_finite_positive(bad, self, ("rms_norm_eps",))
        if self.hidden_act != "silu":
            raise bad("hidden_act", f"only 'silu' is supported, got {self.hidden_act!r}")
        if self.attention_bias or self.mlp_bias:
            field = "attention_bias" if self.attention_bias else "mlp_bias"
            raise bad(field, "biases are not supported (Llama checkpoints have none)")
        require_dtype(bad, "torch_dtype", self.torch_dtype_name)
        cfg = msgspec.structs.replace(self, num_key_value_heads=kv_heads, head_dim=head_dim)
        cfg._check_rope(bad)
        return cfg

    def _check_rope(self, bad: FieldError) -> None:
        field = "rope_scaling" if self.rope_scaling else "rope_parameters"
        theta = self.rope_base
        if not (theta > 0 and math.isfinite(theta)):
            raise bad("rope_theta", f"must be a finite number > 0, got {theta}")
        kind = self.rope_type
        if kind not in ROPE_TYPES:
            raise bad(f"{field}.rope_type", f"unsupported RoPE type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
        params = self._rope_dict()
        needed = ("factor",) if kind == "linear" else _LLAMA3_KEYS if kind == "llama3" else ()
        for key in needed:
            if key == "original_max_position_embeddings" and key not in params:
                continue  # defaults to max_position_embeddings
            value = params.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(f"{field}.{key}", f"expected a number, got {value!r}")
            if not (value > 0 and math.isfinite(value)):
                raise bad(f"{field}.{key}", f"must be a finite number > 0, got {value}")
        if kind == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
            raise bad(
                f"{field}.high_freq_factor",
                f"must exceed low_freq_factor ({params['high_freq_factor']} <= {params['low_freq_factor']})",
            )
