"""The Llama config of Orpheus's LLM, read from a Hugging Face ``config.json``.

Field names are HF ``LlamaConfig``'s so a downloaded checkpoint's config reads as is;
unknown fields are ignored (real configs carry many we do not need).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import msgspec

# RoPE variants we implement; anything else must fail loudly rather than give wrong positions.
ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class ConfigError(ValueError):
    """A config.json that is unreadable, mistyped, or describes an impossible model."""


class LlamaConfig(msgspec.Struct, kw_only=True):
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
    def from_dir(cls, path: str | Path) -> LlamaConfig:
        """Read ``<path>/config.json`` (or ``path`` itself if it names a file)."""
        path = Path(path)
        file = path if path.is_file() else path / "config.json"
        if not file.is_file():
            raise ConfigError(f"{file}: no such file (expected an HF checkpoint directory with config.json)")
        return cls.from_json(file.read_bytes(), source=str(file.name))

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> LlamaConfig:
        try:
            cfg = msgspec.json.decode(data, type=cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{source}: {_field_message(str(exc))}") from None
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{source}: not valid JSON: {exc}") from None
        return cfg._resolved(source)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> LlamaConfig:
        return cls.from_json(msgspec.json.encode(data), source=source)

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
        def bad(field: str, why: str) -> ConfigError:
            return ConfigError(f"{source}: {field}: {why}")

        for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "max_position_embeddings"):
            value = getattr(self, field)
            if value <= 0:
                raise bad(field, f"must be > 0, got {value}")
        heads = self.num_attention_heads
        kv_heads = heads if self.num_key_value_heads is None else self.num_key_value_heads
        if kv_heads <= 0:
            raise bad("num_key_value_heads", f"must be > 0, got {kv_heads}")
        if heads % kv_heads:
            raise bad("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
        if self.head_dim is None:
            if self.hidden_size % heads:
                raise bad("hidden_size", f"{self.hidden_size} is not divisible by num_attention_heads={heads}")
            head_dim = self.hidden_size // heads
        else:
            head_dim = self.head_dim
        if head_dim <= 0 or head_dim % 2:
            raise bad("head_dim", f"must be a positive even number (RoPE rotates pairs), got {head_dim}")
        if not (self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps)):
            raise bad("rms_norm_eps", f"must be a finite number > 0, got {self.rms_norm_eps}")
        if self.hidden_act != "silu":
            raise bad("hidden_act", f"only 'silu' is supported, got {self.hidden_act!r}")
        if self.attention_bias or self.mlp_bias:
            field = "attention_bias" if self.attention_bias else "mlp_bias"
            raise bad(field, "biases are not supported (Llama checkpoints have none)")
        name = self.torch_dtype_name
        if name is not None and name not in ("float32", "float16", "bfloat16"):
            raise bad("torch_dtype", f"expected float32, float16 or bfloat16, got {name!r}")
        cfg = msgspec.structs.replace(self, num_key_value_heads=kv_heads, head_dim=head_dim)
        cfg._check_rope(bad)
        return cfg

    def _check_rope(self, bad: Any) -> None:
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
            raise bad(f"{field}.high_freq_factor",
                      f"must exceed low_freq_factor ({params['high_freq_factor']} <= {params['low_freq_factor']})")


_PATH_RE = re.compile(r"^(?P<msg>.*) - at `\$(?P<path>[^`]*)`$")
_MISSING_RE = re.compile(r"^Object missing required field `(?P<field>[^`]+)`(?: - at `\$(?P<path>[^`]*)`)?$")


def _field_message(text: str) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.hidden_size`" -> "hidden_size: Expected `int`, got `str`"."""
    missing = _MISSING_RE.match(text)
    if missing:
        prefix = (missing.group("path") or "").lstrip(".")
        field = f"{prefix}.{missing.group('field')}" if prefix else missing.group("field")
        return f"{field}: missing required field"
    located = _PATH_RE.match(text)
    if located:
        return f"{located.group('path').lstrip('.')}: {located.group('msg')}"
    return text
