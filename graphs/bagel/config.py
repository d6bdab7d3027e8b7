"""The BAGEL config, read from a released directory's ``llm_config.json``.

``llm_config.json`` holds Qwen2.5's fields (``Qwen2Config``); BAGEL's app.py then forces three
things whatever the file says, and so does :class:`LlmConfig`: per-head q/k RMSNorm on
(``qk_norm``), an untied LM head (``tie_word_embeddings = False``) and Mixture-of-Transformers
layers (``layer_module = "Qwen2MoTDecoderLayer"``: every layer has a ``_moe_gen`` twin).

The BAGEL-level sizes (:class:`BagelDims`) are app.py constants, in no released json. Our
generated checkpoints shrink them with an object ``"mstar_bagel": {...}`` in ``llm_config.json``
and say their weights are random with ``"mstar_random_weights": true``; a released directory has
neither. Unknown Qwen2 fields are ignored (the file carries many we do not need).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from mstar_graphs.common.config_loader import (
    ConfigError,
    FieldError,
    JsonConfig,
    convert,
    decode_json,
    field_error,
    require_divides,
    require_finite_positive,
    require_positive,
)

LLM_CONFIG_FILE = "llm_config.json"
MOT_LAYER = "Qwen2MoTDecoderLayer"


class _Qwen2Fields(msgspec.Struct, frozen=True, kw_only=True):
    """The Qwen2 fields of llm_config.json the model is built from (Qwen2Config's defaults)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0  # Qwen2.5-7B's file says 1e6
    max_position_embeddings: int = 32768


class LlmConfig(_Qwen2Fields, JsonConfig, frozen=True, kw_only=True):
    """The Qwen2 MoT language model, after app.py's overrides."""

    checkpoint = "a BAGEL checkpoint directory"

    # app.py's overrides (the file's values are not used)
    qk_norm: bool = True
    tie_word_embeddings: bool = False
    layer_module: str = MOT_LAYER

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = LLM_CONFIG_FILE) -> LlmConfig:
        return BagelConfig.from_json(data, source=source).llm

    @classmethod
    def from_dir(cls, path: str | Path) -> LlmConfig:
        return BagelConfig.from_dir(path).llm

    def validated(self, source: str = LLM_CONFIG_FILE) -> LlmConfig:
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
                "num_key_value_heads",
                "max_position_embeddings",
            ),
        )
        require_finite_positive(bad, self, ("rms_norm_eps", "rope_theta"))
        require_divides(bad, "num_attention_heads", self.num_attention_heads, "hidden_size", self.hidden_size)
        require_divides(
            bad, "num_key_value_heads", self.num_key_value_heads, "num_attention_heads", self.num_attention_heads
        )
        if self.head_dim % 2:
            raise bad("hidden_size", f"head_dim = hidden_size / num_attention_heads = {self.head_dim} must be even")
        if self.hidden_act != "silu":
            raise bad("hidden_act", f"only 'silu' is supported (Qwen2's), got {self.hidden_act!r}")
        return self


class BagelDims(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """BAGEL-level sizes app.py passes to ``BagelConfig`` / the image transforms (no json holds them).

    A transform is ``(max_size, min_size, stride)`` of ``ImageTransform``.
    """

    vit_max_num_patch_per_side: int = 70  # position-id stride of the ViT rows (id = row * 70 + col)
    max_latent_size: int = 64  # same for the latent tokens
    latent_patch_size: int = 2  # p: a latent token is p x p latent pixels
    latent_channels: int = 16  # C: the VAE's z channels
    connector_act: str = "gelu_pytorch_tanh"
    vit_transform: tuple[int, int, int] = (980, 224, 14)
    vae_transform: tuple[int, int, int] = (1024, 512, 16)

    @property
    def latent_token_dim(self) -> int:
        """Width of one latent token (p * p * C): llm2vae's output, vae2llm's input."""
        return self.latent_patch_size**2 * self.latent_channels

    def validated(self, bad: FieldError, prefix: str = "mstar_bagel") -> BagelDims:
        require_positive(
            bad, self, ("vit_max_num_patch_per_side", "max_latent_size", "latent_patch_size", "latent_channels"), prefix
        )
        if self.connector_act != "gelu_pytorch_tanh":
            raise bad(f"{prefix}.connector_act", f"only 'gelu_pytorch_tanh' is supported, got {self.connector_act!r}")
        for name, grid in (("vit_transform", self.vit_max_num_patch_per_side), ("vae_transform", self.max_latent_size)):
            max_size, min_size, stride = getattr(self, name)
            if not 0 < stride <= min_size <= max_size:
                raise bad(
                    f"{prefix}.{name}",
                    f"(max_size, min_size, stride) needs 0 < stride <= min <= max, got {getattr(self, name)}",
                )
            if max_size // stride > grid:  # a longer side would index past the position tables
                grid_field = "vit_max_num_patch_per_side" if name == "vit_transform" else "max_latent_size"
                raise bad(
                    f"{prefix}.{name}",
                    f"max_size / stride = {max_size // stride} tokens per side exceeds {grid_field}={grid}",
                )
        return self


class BagelConfig(msgspec.Struct, JsonConfig, frozen=True, kw_only=True):
    """What ``llm_config.json`` says: the LLM, the BAGEL-level sizes, whether the weights are random."""

    checkpoint = "a BAGEL checkpoint directory"

    llm: LlmConfig
    dims: BagelDims = BagelDims()
    random_weights: bool = False

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = LLM_CONFIG_FILE) -> BagelConfig:
        return decode_json(data, _RawLlmConfig, source).resolve(source)

    @classmethod
    def from_dir(cls, path: str | Path) -> BagelConfig:
        """Read ``<path>/llm_config.json`` (or ``path`` itself if it names a file)."""
        file = llm_config_file(path)
        return cls.from_json(file.read_bytes(), source=str(file))


def llm_config_file(path: str | Path) -> Path:
    path = Path(path)
    file = path if path.is_file() else path / LLM_CONFIG_FILE
    if not file.is_file():
        raise ConfigError(f"{file}: no such file (expected a BAGEL checkpoint directory with {LLM_CONFIG_FILE})")
    return file


class _DimsHolder(msgspec.Struct):
    mstar_bagel: BagelDims


class _RawLlmConfig(_Qwen2Fields, frozen=True, kw_only=True):
    """What llm_config.json may say: the Qwen2 fields, two we refuse to ignore, our two extensions.
    The fields app.py overrides are not read."""

    rope_scaling: dict[str, Any] | None = None
    model_type: str | None = None
    mstar_bagel: dict[str, Any] | None = None
    mstar_random_weights: bool = False

    def resolve(self, source: str) -> BagelConfig:
        bad = field_error(source)
        if self.model_type is not None and self.model_type != "qwen2":
            raise bad("model_type", f"expected 'qwen2' (BAGEL's LLM is Qwen2.5), got {self.model_type!r}")
        if self.rope_scaling is not None:
            raise bad("rope_scaling", f"must be null (BAGEL uses plain RoPE), got {self.rope_scaling}")
        llm = LlmConfig(**{f: getattr(self, f) for f in _Qwen2Fields.__struct_fields__}).validated(source)
        # through a wrapper, so msgspec's error path reads "mstar_bagel.<field>"
        dims = convert({"mstar_bagel": self.mstar_bagel or {}}, _DimsHolder, source).mstar_bagel.validated(bad)
        return BagelConfig(llm=llm, dims=dims, random_weights=self.mstar_random_weights)
