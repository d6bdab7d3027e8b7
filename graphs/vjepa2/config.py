"""V-JEPA 2-AC sizes: the encoder (ViT, 3-D RoPE) and the action-conditioned predictor.

Released values (Meta's ``vjepa2-ac-vitg.pt``, hub entry ``vjepa2_ac_vit_giant``): encoder
``vit_giant_xformers`` 1408 wide, 40 deep, 22 heads (head dim 64), MLP 6144, 256 px, patch 16,
tubelet 2; predictor 1024 wide, 24 deep, 16 heads, MLP ratio 4, 7-d actions and states,
``num_frames`` 64 (so 64 // 2 = 32 frames in one context: the size of its prebuilt mask).
"""

from __future__ import annotations

import json

import msgspec

from mstar_graphs.common.config_loader import JsonConfig, decode_json, field_error


class EncoderConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    width: int = 1408
    depth: int = 40
    heads: int = 22
    mlp_hidden: int = 6144
    image_size: int = 256
    patch_size: int = 16
    tubelet: int = 2
    eps: float = 1e-6

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid * self.grid


class PredictorConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    width: int = 1024
    depth: int = 24
    heads: int = 16
    mlp_ratio: float = 4.0
    action_dim: int = 7
    num_frames: int = 64  # video frames; the context holds num_frames // tubelet frames
    eps: float = 1e-6


class VJepa2Config(msgspec.Struct, JsonConfig, forbid_unknown_fields=True, frozen=True):
    checkpoint = "a V-JEPA 2-AC checkpoint directory"

    encoder: EncoderConfig = EncoderConfig()
    predictor: PredictorConfig = PredictorConfig()
    normalize_reps: bool = True  # F.layer_norm (no affine, eps 1e-5) on encoder and predictor outputs
    model_type: str = "mstar_vjepa2_ac"

    @property
    def max_frames(self) -> int:
        return self.predictor.num_frames // self.encoder.tubelet

    @property
    def frame_tokens(self) -> int:
        return 2 + self.encoder.num_patches  # action, state, then the frame's patches

    def validated(self, source: str = "V-JEPA 2-AC config") -> VJepa2Config:
        e, p = self.encoder, self.predictor
        checks = [
            ("encoder.width", e.width > 0 and e.width % e.heads == 0),
            ("encoder.heads", e.heads > 0 and (e.width // e.heads) % 2 == 0),
            ("encoder.image_size", e.image_size > 0 and e.image_size % e.patch_size == 0),
            ("encoder.tubelet", e.tubelet >= 1),
            ("predictor.width", p.width > 0 and p.width % p.heads == 0),
            ("predictor.heads", p.heads > 0 and (p.width // p.heads) % 2 == 0),
            ("predictor.action_dim", p.action_dim == 7),
            ("predictor.num_frames", p.num_frames >= e.tubelet),
            ("encoder.depth", e.depth >= 1),
            ("predictor.depth", p.depth >= 1),
        ]
        for name, ok in checks:
            if not ok:
                raise field_error(source)(name, f"invalid in {self}")
        return self

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "config.json") -> VJepa2Config:
        return decode_json(data, cls, source).validated(source)

    def to_json(self) -> str:
        return json.dumps(msgspec.to_builtins(self), indent=2) + "\n"


RELEASED = VJepa2Config()
PRESETS: dict[str, VJepa2Config] = {
    # CI: 32 px frames of 4x4 patches, head dim 16 (5/5/5 RoPE split is 4/4/4 + 4 unrotated)
    "tiny": VJepa2Config(
        EncoderConfig(width=64, depth=2, heads=4, mlp_hidden=128, image_size=32, patch_size=8),
        PredictorConfig(width=64, depth=2, heads=4, num_frames=64),
    ),
    # benchmarks: the released frame layout (256 patches + 2 tokens per frame, head dim 64), fewer,
    # narrower layers so a CPU finishes
    "bench": VJepa2Config(
        EncoderConfig(width=192, depth=2, heads=3, mlp_hidden=384),
        PredictorConfig(width=256, depth=4, heads=4, num_frames=64),
    ),
    "released": RELEASED,
}
