"""SNAC codec hyper-parameters, read from the checkpoint's config.json.

Field names are exactly those of SNAC's config.json (and of ``snac.SNAC.__init__``),
so a config round-trips between our decoder, the reference package and the hub file.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from mstar_graphs.common.config_loader import JsonConfig, decode_json


class SnacConfig(msgspec.Struct, JsonConfig, kw_only=True, frozen=True):
    checkpoint = "a SNAC checkpoint directory"

    sampling_rate: int
    encoder_dim: int
    encoder_rates: list[int]
    decoder_dim: int
    decoder_rates: list[int]
    attn_window_size: int | None
    codebook_size: int
    codebook_dim: int
    vq_strides: list[int]
    noise: bool
    depthwise: bool
    # Optional in SNAC's config.json: when absent it is derived from the encoder.
    latent_dim: int | None = None
    # Set by our random-weight test/bench checkpoints (tiny_snac.py), never by real ones.
    mstar_random_weights: bool = False

    def __post_init__(self) -> None:
        for name in ("sampling_rate", "encoder_dim", "decoder_dim", "codebook_size", "codebook_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SnacConfig field {name!r} must be positive, got {getattr(self, name)}")
        for name in ("encoder_rates", "decoder_rates", "vq_strides"):
            values = getattr(self, name)
            if not values or any(v <= 0 for v in values):
                raise ValueError(f"SnacConfig field {name!r} must be a non-empty list of positive ints, got {values}")
        if self.latent_dim is not None and self.latent_dim <= 0:
            raise ValueError(f"SnacConfig field 'latent_dim' must be positive or null, got {self.latent_dim}")
        if self.attn_window_size is not None and self.attn_window_size <= 0:
            raise ValueError(
                f"SnacConfig field 'attn_window_size' must be positive or null, got {self.attn_window_size}"
            )
        if self.decoder_dim % (2 ** len(self.decoder_rates)) != 0:
            # Each decoder block halves the channel count.
            raise ValueError(
                f"SnacConfig field 'decoder_dim' ({self.decoder_dim}) must be divisible by "
                f"2**len(decoder_rates) = {2 ** len(self.decoder_rates)}"
            )

    @property
    def hop_length(self) -> int:
        """Audio samples per latent frame (= per code of a stride-1 level)."""
        return math.prod(self.encoder_rates)

    @property
    def resolved_latent_dim(self) -> int:
        """``latent_dim``, or SNAC's default when the config leaves it null."""
        if self.latent_dim is not None:
            return self.latent_dim
        return self.encoder_dim * (2 ** len(self.encoder_rates))

    @property
    def n_levels(self) -> int:
        return len(self.vq_strides)

    def snac_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``snac.SNAC(**kwargs)`` (reference package)."""
        out = msgspec.structs.asdict(self)
        out.pop("mstar_random_weights")
        return out

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> SnacConfig:
        return decode_json(data, cls, source)
