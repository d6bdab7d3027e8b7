"""BAGEL's SigLIP NaViT config, read from a released checkpoint's ``vit_config.json``.

The file holds transformers' ``SiglipVisionConfig`` fields. BAGEL's loader (app.py, the
notebook) overrides two of them, and so do we: ``rope`` is off (a learned position table
instead) and the model has one layer fewer than the file says (training dropped the last
layer; the checkpoint holds ``num_hidden_layers - 1`` layers). Unknown fields are ignored.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from mstar_graphs.common.config_loader import (
    ConfigError,
    JsonConfig,
    decode_json,
    field_error,
    require_divides,
    require_finite_positive,
    require_positive,
)

VIT_CONFIG_FILE = "vit_config.json"
SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh",)


class _RawVitConfig(msgspec.Struct, kw_only=True):
    """The file's fields (SigLIP names), before the overrides."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    image_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"


class VitConfig(msgspec.Struct, JsonConfig, frozen=True, kw_only=True):
    """The ViT as BAGEL builds it. ``num_hidden_layers`` is the model's layer count (file value - 1)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    image_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    checkpoint = "a BAGEL checkpoint directory with vit_config.json"

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = VIT_CONFIG_FILE) -> VitConfig:
        raw = decode_json(data, _RawVitConfig, source)
        bad = field_error(source)
        if raw.num_hidden_layers < 2:
            # the file counts one layer more than the model has, so 1 would leave none
            raise bad(
                "num_hidden_layers", f"must be >= 2 (BAGEL uses num_hidden_layers - 1), got {raw.num_hidden_layers}"
            )
        return cls(**{f: getattr(raw, f) for f in raw.__struct_fields__}).with_overrides().validated(source)

    def with_overrides(self) -> VitConfig:
        """app.py's change to the file's values: one layer fewer (rope=False is implied: no RoPE here)."""
        return msgspec.structs.replace(self, num_hidden_layers=self.num_hidden_layers - 1)

    @classmethod
    def from_dir(cls, path: str | Path) -> VitConfig:
        """Read ``<path>/vit_config.json`` (or ``path`` itself if it names a file)."""
        path = Path(path)
        file = path if path.is_file() else path / VIT_CONFIG_FILE
        if not file.is_file():
            raise ConfigError(f"{file}: no such file (expected {cls.checkpoint})")
        return cls.from_json(file.read_bytes(), source=str(file))

    def validated(self, source: str = "vit config") -> VitConfig:
        bad = field_error(source)
        require_positive(
            bad,
            self,
            (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "patch_size",
                "image_size",
            ),
        )
        require_finite_positive(bad, self, ("layer_norm_eps",))
        require_divides(bad, "num_attention_heads", self.num_attention_heads, "hidden_size", self.hidden_size)
        require_divides(bad, "patch_size", self.patch_size, "image_size", self.image_size)
        if self.num_channels != 3:
            raise bad("num_channels", f"must be 3 (RGB), got {self.num_channels}")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise bad("hidden_act", f"expected one of {list(SUPPORTED_ACTIVATIONS)}, got {self.hidden_act!r}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid(self) -> int:
        """Patches per side of the learned position table (its rows: grid**2)."""
        return self.image_size // self.patch_size

    @property
    def patch_dim(self) -> int:
        """Values per patch row: channels * patch_size**2."""
        return self.num_channels * self.patch_size**2
