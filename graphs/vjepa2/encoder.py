"""The V-JEPA 2 video encoder as a stateless node: camera frames in, layer-normed latents out.

Frames are prepared as Meta's AC code prepares them (``app/vjepa_droid/transforms.py`` with the
notebook's settings): a centre square crop, a bilinear resize to ``image_size`` (no antialias),
ImageNet normalisation. Each frame is encoded alone, repeated to fill one tubelet, so its RoPE
depth position is 0; the encoder's own final LayerNorm is followed by a LayerNorm without affine
(eps 1e-5), as the world-model wrapper applies it (``normalize_reps``). Module names follow
Meta's checkpoint (``patch_embed.proj``, ``blocks.N.attn.qkv``, ``norm``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.vjepa2.config import EncoderConfig, VJepa2Config
from mstar_graphs.vjepa2.rope import patch_grid_positions, rope_tables
from mstar_graphs.vjepa2.vit import Block, dense_attend

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
REPS_EPS = 1e-5  # F.layer_norm's default, which the wrapper uses


def center_square(frames: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> the centre min(H, W) square (Meta's fallback crop at aspect ratio 1)."""
    h, w = frames.shape[-2:]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2  # floored, as Meta's crop
    return frames[..., top : top + side, left : left + side]


def prepare_frames(frames: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (or 0..255 float) [B, H, W, 3] RGB -> normalised [B, 3, size, size] float32."""
    if frames.dim() != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [H, W, 3] RGB images; got shape {tuple(frames.shape)[1:]}")
    x = frames.float()
    if not torch.isfinite(x).all():
        raise ValueError("frames contain NaN or infinite values")
    x = center_square(x.permute(0, 3, 1, 2))
    if x.shape[-1] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1) * 255.0
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1) * 255.0
    return (x - mean) / std


class PatchEmbed3D(nn.Module):
    def __init__(self, c: EncoderConfig, **factory) -> None:
        super().__init__()
        self.tubelet = c.tubelet
        self.proj = nn.Conv3d(
            3,
            c.width,
            kernel_size=(c.tubelet, c.patch_size, c.patch_size),
            stride=(c.tubelet, c.patch_size, c.patch_size),
            **factory,
        )

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, S, S] (one frame) -> [B, patches, width]: the frame fills a tubelet."""
        clip = pixels.unsqueeze(2).repeat(1, 1, self.tubelet, 1, 1)
        return self.proj(clip.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2)


class VJepa2Encoder(NodeSubmodule):
    """Node ``encoder``: input ``frames`` [H, W, 3] or [F, H, W, 3] -> ``latents`` [(F,) patches, width]."""

    def __init__(self, config: VJepa2Config, **factory) -> None:
        super().__init__()
        self.config = config.validated()
        c = config.encoder
        self.patch_embed = PatchEmbed3D(c, **factory)
        self.blocks = nn.ModuleList(Block(c.width, c.heads, c.mlp_hidden, c.eps, **factory) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width, eps=c.eps, **factory)

    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Normalised [B, 3, S, S] -> the encoder's output [B, patches, width] (its own final norm
        applied; what transformers' ``VJEPA2Model`` returns as ``last_hidden_state``)."""
        c = self.config.encoder
        x = self.patch_embed(pixels)
        b, n, width = x.shape
        h, w = patch_grid_positions(c.grid, x.device)
        cos, sin = rope_tables(width // c.heads, torch.zeros_like(h), h, w)
        cos, sin = cos.repeat(b, 1), sin.repeat(b, 1)
        rows = x.reshape(b * n, width)
        attend = dense_attend(b)
        for i, block in enumerate(self.blocks):
            rows = block(rows, cos, sin, attend, i)
        return self.norm(rows).view(b, n, width)

    def forward(self, frames: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        lead = frames.shape[:-3]
        flat = frames.reshape(-1, *frames.shape[-3:])
        pixels = prepare_frames(flat, self.config.encoder.image_size).to(self.norm.weight.dtype)
        latents = self.encode_pixels(pixels)
        if self.config.normalize_reps:
            latents = F.layer_norm(latents, (latents.shape[-1],), eps=REPS_EPS)
        return {"latents": latents.reshape(*lead, *latents.shape[1:])}

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict[str, torch.Tensor]:
        for call in calls:
            frames = call.inputs.get("frames")
            if frames is None or frames.dim() not in (3, 4) or frames.shape[-1] != 3:
                shape = None if frames is None else tuple(frames.shape)
                raise ValueError(f"encoder: input 'frames' must be [H, W, 3] or [F, H, W, 3] RGB; got {shape}")
        return super().prepare_inputs(calls)
