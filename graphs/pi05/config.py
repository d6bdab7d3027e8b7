"""The pi0.5 config, read from a checkpoint directory's ``config.json``.

Two real layouts are understood:

- openpi's PyTorch port (``examples/convert_jax_model_to_pytorch.py``) writes
  ``{action_dim, action_horizon, paligemma_variant, action_expert_variant, precision}``;
- LeRobot's ``pi05`` policy writes ``{type: "pi05", chunk_size, max_action_dim,
  max_state_dim, num_inference_steps, paligemma_variant, action_expert_variant, dtype,
  image_resolution, tokenizer_max_length, min_period, max_period, ...}``.

Both name the Gemma sizes by variant ("gemma_2b" prefix LM, "gemma_300m" expert); the
SigLIP tower is always So400m/14 at 224 px. Our generated checkpoints add an
``mstar_dims`` object with explicit sizes (their variants are not real ones).
Unknown fields are ignored: real configs carry many we do not need.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mstar_graphs.common.config_loader import (
    ConfigError,
    JsonConfig,
    convert,
    decode_json,
    field_error,
    require_divides,
    require_dtype,
    require_finite_positive,
    require_positive,
)


class VisionDims(msgspec.Struct, frozen=True, kw_only=True):
    """SigLIP vision tower (PaliGemma's So400m/14 by default)."""

    image_size: int = 224
    patch_size: int = 14
    width: int = 1152
    depth: int = 27
    heads: int = 16
    mlp_dim: int = 4304
    layer_norm_eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class GemmaDims(msgspec.Struct, frozen=True, kw_only=True):
    """One Gemma stack (openpi's ``gemma.Config`` field names)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


# openpi `gemma.get_config` sizes of the variants pi0.5 uses.
VARIANTS: dict[str, GemmaDims] = {
    "gemma_2b": GemmaDims(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaDims(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}
PALIGEMMA_VOCAB = 257152
BOS_ID = 2  # Gemma's <bos>; openpi encodes prompts with add_bos=True


class Pi05Config(msgspec.Struct, JsonConfig, frozen=True, kw_only=True):
    checkpoint = "a pi0.5 checkpoint directory"

    vision: VisionDims = VisionDims()
    prefix: GemmaDims = VARIANTS["gemma_2b"]
    expert: GemmaDims = VARIANTS["gemma_300m"]
    vocab_size: int = PALIGEMMA_VOCAB
    bos_token_id: int = BOS_ID
    action_horizon: int = 50
    action_dim: int = 32
    discrete_state_input: bool = True  # the state as text in the prompt (openpi pi05_libero: False)
    max_token_len: int = 200  # openpi Pi0Config default for pi05
    num_steps: int = 10
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    min_period: float = 4e-3  # sinusoidal flow-time embedding
    max_period: float = 4.0
    max_positions: int = 8192  # Gemma's max_position_embeddings (RoPE tables are built this long)
    dtype: str = "float32"
    random_weights: bool = False

    # ----------------------------------------------------------------- reading

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> Pi05Config:
        return decode_json(data, _RawConfig, source).resolve(source)

    # ------------------------------------------------------------- validation

    def validated(self, source: str = "config") -> Pi05Config:
        bad = field_error(source)
        for name, dims in (("vision", self.vision), ("paligemma", self.prefix), ("action_expert", self.expert)):
            fields = tuple(field.name for field in msgspec.structs.fields(dims))
            require_finite_positive(bad, dims, fields, prefix=name)
        v = self.vision
        if v.image_size % v.patch_size:
            raise bad("vision.patch_size", f"{v.patch_size} does not divide image_size={v.image_size}")
        require_divides(bad, "vision.heads", v.heads, "width", v.width)
        for name, g in (("paligemma", self.prefix), ("action_expert", self.expert)):
            require_divides(bad, f"{name}.num_kv_heads", g.num_kv_heads, "num_heads", g.num_heads)
            if g.head_dim % 2:
                raise bad(f"{name}.head_dim", f"must be even (RoPE rotates pairs), got {g.head_dim}")
        # The expert's attention reads the prefix KV layer by layer, in the same heads.
        for field in ("depth", "num_kv_heads", "head_dim", "num_heads"):
            if getattr(self.expert, field) != getattr(self.prefix, field):
                raise bad(
                    f"action_expert.{field}",
                    f"must equal the prefix LM's ({getattr(self.prefix, field)}): "
                    f"the expert attends to the prefix KV; got {getattr(self.expert, field)}",
                )
        if self.expert.width % 2:
            raise bad("action_expert.width", f"must be even (sin|cos time embedding), got {self.expert.width}")
        require_positive(
            bad, self, ("vocab_size", "action_horizon", "action_dim", "max_token_len", "num_steps", "max_positions")
        )
        if not 0 <= self.bos_token_id < self.vocab_size:
            raise bad("bos_token_id", f"{self.bos_token_id} is outside the vocabulary [0, {self.vocab_size})")
        require_finite_positive(bad, self, ("rope_theta", "rms_norm_eps", "min_period", "max_period"))
        require_dtype(bad, "precision", self.dtype)
        return self


class _RawConfig(msgspec.Struct, kw_only=True):
    """Every field either real layout may carry (openpi | LeRobot | ours)."""

    type: str | None = None  # LeRobot policy type
    pi05: bool | None = None  # openpi Pi0Config flag, when a full config is dumped
    action_dim: int | None = None  # openpi
    action_horizon: int | None = None  # openpi
    max_action_dim: int | None = None  # LeRobot
    chunk_size: int | None = None  # LeRobot
    max_state_dim: int | None = None  # LeRobot (only bounds the state; LeRobot >= 0.5 no longer pads to it)
    discrete_state_input: bool = True  # openpi Pi0Config, when a full config is dumped
    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    precision: str | None = None  # openpi
    dtype: str | None = None  # LeRobot
    num_inference_steps: int | None = None  # LeRobot
    max_token_len: int | None = None  # openpi
    tokenizer_max_length: int | None = None  # LeRobot
    image_resolution: list[int] | None = None  # LeRobot
    min_period: float = 4e-3
    max_period: float = 4.0
    mstar_dims: dict[str, Any] | None = None  # ours: explicit sizes for non-standard variants
    mstar_random_weights: bool = False

    def resolve(self, source: str) -> Pi05Config:
        bad = field_error(source)
        if self.type is not None and self.type != "pi05":
            raise bad("type", f"expected 'pi05', got {self.type!r} (only pi0.5 checkpoints are supported)")
        if self.pi05 is False:
            raise bad("pi05", "false (a pi0 checkpoint; only pi0.5 is supported)")
        dims = dict(self.mstar_dims or {})
        vision = convert(dims.pop("vision", {}), VisionDims, source, "mstar_dims.vision")
        if self.image_resolution is not None:
            if len(self.image_resolution) != 2 or self.image_resolution[0] != self.image_resolution[1]:
                raise bad("image_resolution", f"must be square [N, N], got {self.image_resolution}")
            vision = msgspec.structs.replace(vision, image_size=self.image_resolution[0])
        prefix = _variant(self.paligemma_variant, dims.pop("paligemma", None), source, "paligemma_variant")
        expert = _variant(self.action_expert_variant, dims.pop("action_expert", None), source, "action_expert_variant")
        extra: dict[str, Any] = {}
        for key in ("vocab_size", "rope_theta", "rms_norm_eps", "max_positions", "bos_token_id"):
            if key in dims:
                extra[key] = dims.pop(key)
        if dims:
            raise bad("mstar_dims", f"unknown keys {sorted(dims)}")
        cfg = Pi05Config(
            vision=vision,
            prefix=prefix,
            expert=expert,
            action_horizon=_first(self.action_horizon, self.chunk_size, 50),
            action_dim=_first(self.action_dim, self.max_action_dim, 32),
            discrete_state_input=self.discrete_state_input,
            max_token_len=_first(self.max_token_len, self.tokenizer_max_length, 200),
            num_steps=_first(self.num_inference_steps, None, 10),
            min_period=self.min_period,
            max_period=self.max_period,
            dtype=self.precision or self.dtype or "float32",
            random_weights=self.mstar_random_weights,
        )
        # through builtins, so the extra values' types are checked too
        return convert({**msgspec.to_builtins(cfg), **extra}, Pi05Config, source, "mstar_dims").validated(source)


def _first(a: int | None, b: int | None, default: int) -> int:
    return a if a is not None else b if b is not None else default


def _variant(name: str, explicit: dict[str, Any] | None, source: str, field: str) -> GemmaDims:
    if explicit is not None:
        return convert(explicit, GemmaDims, source, f"mstar_dims.{field.removesuffix('_variant')}")
    if name not in VARIANTS:
        raise ConfigError(
            f"{source}: {field}: unknown Gemma variant {name!r} (known: {', '.join(VARIANTS)}; "
            f"other sizes need an explicit mstar_dims entry)"
        )
    return VARIANTS[name]
