"""The FLUX.1 VAE BAGEL uses (``modeling/autoencoder.py``), with its shape read from ``ae.safetensors``.

The reference hardcodes ch 128, ch_mult [1, 2, 4, 4], 2 res blocks per level and 16 latent
channels; we infer those four from the tensors' shapes (so a small generated VAE loads too) and
keep the constants: latent = 0.3611 * (mean - 0.1159), image = decoder(latent / 0.3611 + 0.1159).

- ``ResnetBlock``: GroupNorm(32, eps 1e-6) -> swish -> conv3x3, twice; a 1x1 ``nin_shortcut`` on
  the skip when the width changes.
- ``AttnBlock`` (middle only): GroupNorm, 1x1 q/k/v, one head over the h*w positions (scale c**-0.5),
  1x1 ``proj_out``, residual.
- ``Downsample``: zero pad right and bottom by one, conv3x3 stride 2; ``Upsample``: nearest x2, conv3x3.
- Encoder: conv_in, levels of res blocks with a downsample after all but the last, middle (block,
  attn, block), GroupNorm, swish, conv_out to 2 * z channels (mean | log variance).
- Decoder: conv_in, middle, levels from last to first with num_res_blocks + 1 blocks each and an
  upsample after all but level 0, GroupNorm, swish, conv_out to RGB.

The reference's ``encode`` samples ``mean + std * noise`` from the global RNG. Ours returns the mean
unless given a ``generator``, with which it samples the same way (reproducibly).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import torch
import torch.nn.functional as F
from torch import nn

from mstar.weights import CheckpointReader, WeightsError, load_weights
from mstar_graphs.bagel.ema_parts import build_empty

SCALE_FACTOR = 0.3611
SHIFT_FACTOR = 0.1159
GROUPS = 32


class VaeShape(msgspec.Struct, frozen=True, kw_only=True):
    """The sizes the reference's ``AutoEncoderParams`` gives (FLUX: 128, (1, 2, 4, 4), 2, 16)."""

    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 16
    in_channels: int = 3
    out_ch: int = 3

    @property
    def downsample(self) -> int:
        """Pixels per latent cell along a side (8 for four levels)."""
        return 2 ** (len(self.ch_mult) - 1)


def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def _norm(channels: int, **factory: object) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=1e-6, affine=True, **factory)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, **factory: object) -> None:
        super().__init__()
        self.norm1 = _norm(in_channels, **factory)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1, **factory)
        self.norm2 = _norm(out_channels, **factory)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, **factory)
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1, **factory) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, channels: int, **factory: object) -> None:
        super().__init__()
        self.norm = _norm(channels, **factory)
        self.q = nn.Conv2d(channels, channels, 1, **factory)
        self.k = nn.Conv2d(channels, channels, 1, **factory)
        self.v = nn.Conv2d(channels, channels, 1, **factory)
        self.proj_out = nn.Conv2d(channels, channels, 1, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, hh, ww = x.shape
        q, k, v = (proj(h).flatten(2).transpose(1, 2)[:, None] for proj in (self.q, self.k, self.v))  # [B,1,hw,c]
        out = F.scaled_dot_product_attention(q, k, v)[:, 0].transpose(1, 2).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    def __init__(self, channels: int, **factory: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # asymmetric: right and bottom only


class Upsample(nn.Module):
    def __init__(self, channels: int, **factory: object) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class MidBlock(nn.Module):
    def __init__(self, channels: int, **factory: object) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, **factory)
        self.attn_1 = AttnBlock(channels, **factory)
        self.block_2 = ResnetBlock(channels, channels, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Level(nn.Module):
    """One resolution: ``block`` (res blocks, (in, out) widths), then its ``downsample`` / ``upsample``."""

    def __init__(self, widths: list[tuple[int, int]], resample: str | None, **factory: object) -> None:
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(i, o, **factory) for i, o in widths)
        self.resample = resample
        if resample == "downsample":
            self.downsample = Downsample(widths[-1][1], **factory)
        elif resample == "upsample":
            self.upsample = Upsample(widths[-1][1], **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.block:
            x = block(x)
        return x if self.resample is None else getattr(self, self.resample)(x)


class Encoder(nn.Module):
    def __init__(self, shape: VaeShape, **factory: object) -> None:
        super().__init__()
        ch, mult, n = shape.ch, shape.ch_mult, shape.num_res_blocks
        self.conv_in = nn.Conv2d(shape.in_channels, ch, 3, padding=1, **factory)
        levels, width = [], ch
        for i, m in enumerate(mult):
            widths = [(width if b == 0 else ch * m, ch * m) for b in range(n)]
            levels.append(Level(widths, "downsample" if i < len(mult) - 1 else None, **factory))
            width = ch * m
        self.down = nn.ModuleList(levels)
        self.mid = MidBlock(width, **factory)
        self.norm_out = _norm(width, **factory)
        self.conv_out = nn.Conv2d(width, 2 * shape.z_channels, 3, padding=1, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        return self.conv_out(swish(self.norm_out(self.mid(h))))


class Decoder(nn.Module):
    def __init__(self, shape: VaeShape, **factory: object) -> None:
        super().__init__()
        ch, mult, n = shape.ch, shape.ch_mult, shape.num_res_blocks
        width = ch * mult[-1]
        self.conv_in = nn.Conv2d(shape.z_channels, width, 3, padding=1, **factory)
        self.mid = MidBlock(width, **factory)
        levels: list[Level] = []
        for i in reversed(range(len(mult))):  # built deepest first; stored by level index (up[0] is last)
            widths = [(width if b == 0 else ch * mult[i], ch * mult[i]) for b in range(n + 1)]
            levels.insert(0, Level(widths, "upsample" if i > 0 else None, **factory))
            width = ch * mult[i]
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(width, **factory)
        self.conv_out = nn.Conv2d(width, shape.out_ch, 3, padding=1, **factory)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))


class FluxAutoencoder(nn.Module):
    """``encode`` image [B, 3, H, W] in [-1, 1] -> latent [B, z, H/8, W/8]; ``decode`` the reverse."""

    def __init__(
        self,
        shape: VaeShape | None = None,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shape = shape if shape is not None else VaeShape()
        bad = [f"ch * {m} = {shape.ch * m}" for m in (1, *shape.ch_mult) if (shape.ch * m) % GROUPS]
        if bad or shape.ch <= 0 or not shape.ch_mult or shape.num_res_blocks <= 0 or shape.z_channels <= 0:
            raise ValueError(f"VAE shape {shape}: widths must be positive multiples of {GROUPS} (GroupNorm); {bad}")
        self.shape = shape
        self.scale_factor, self.shift_factor = SCALE_FACTOR, SHIFT_FACTOR
        self.encoder = Encoder(shape, dtype=dtype, device=device)
        self.decoder = Decoder(shape, dtype=dtype, device=device)

    @classmethod
    def from_file(cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = False) -> FluxAutoencoder:
        """Load ``ae.safetensors`` (or ``<dir>/ae.safetensors``), its shape inferred from the tensors."""
        path = Path(path)
        file = path / "ae.safetensors" if path.is_dir() else path
        shape = infer_vae_shape(CheckpointReader(file).shapes(), source=str(file))
        module = build_empty(lambda device: cls(shape, device=device))
        load_weights(module, file, dtype=dtype, strict=True, progress=progress, desc="loading the VAE")
        return module.eval()

    @property
    def downsample(self) -> int:
        return self.shape.downsample

    def encode(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] (H, W multiples of ``downsample``) -> scaled latent [B, z, H/8, W/8]:
        the Gaussian's mean, or ``mean + std * noise`` drawn from ``generator`` when one is given."""
        d = self.downsample
        if x.dim() != 4 or x.shape[1] != self.shape.in_channels or x.shape[2] % d or x.shape[3] % d:
            raise ValueError(
                f"VAE input must be [B, {self.shape.in_channels}, H, W] with H and W multiples of {d} "
                f"(the VAE halves the size {len(self.shape.ch_mult) - 1} times), got {tuple(x.shape)}"
            )
        weight = self.encoder.conv_in.weight
        mean, logvar = self.encoder(x.to(weight.dtype)).chunk(2, dim=1)
        z = mean
        if generator is not None:
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=generator.device)
            z = mean + torch.exp(0.5 * logvar) * noise.to(mean.device)
        return self.scale_factor * (z - self.shift_factor)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Scaled latent [B, z, h, w] -> image [B, 3, h*8, w*8] (about [-1, 1]; not clamped)."""
        if z.dim() != 4 or z.shape[1] != self.shape.z_channels:
            raise ValueError(f"VAE latent must be [B, {self.shape.z_channels}, h, w], got {tuple(z.shape)}")
        z = z.to(self.decoder.conv_in.weight.dtype)
        return self.decoder(z / self.scale_factor + self.shift_factor)


_DOWN_LEVEL = re.compile(r"^encoder\.down\.(\d+)\.")
_DOWN_BLOCK = re.compile(r"^encoder\.down\.0\.block\.(\d+)\.")


def infer_vae_shape(shapes: dict[str, tuple[int, ...]], source: str = "ae.safetensors") -> VaeShape:
    """ch, ch_mult, num_res_blocks, z_channels (and in/out channels) from a FLUX VAE's tensor shapes."""

    def get(name: str) -> tuple[int, ...]:
        if name not in shapes:
            raise WeightsError(f"{source}: missing {name} (not a FLUX VAE state dict?)")
        return shapes[name]

    ch, in_channels = get("encoder.conv_in.weight")[:2]
    levels = sorted({int(m.group(1)) for n in shapes if (m := _DOWN_LEVEL.match(n))})
    blocks = sorted({int(m.group(1)) for n in shapes if (m := _DOWN_BLOCK.match(n))})
    if not levels or levels != list(range(len(levels))) or not blocks or blocks != list(range(len(blocks))):
        raise WeightsError(f"{source}: encoder.down levels {levels} / level-0 blocks {blocks} are not 0..n-1")
    mult = []
    for i in levels:
        out = get(f"encoder.down.{i}.block.0.conv1.weight")[0]
        if out % ch:
            raise WeightsError(f"{source}: encoder.down.{i} width {out} is not a multiple of ch={ch}")
        mult.append(out // ch)
    z2 = get("encoder.conv_out.weight")[0]
    z = get("decoder.conv_in.weight")[1]
    if z2 != 2 * z:
        raise WeightsError(f"{source}: encoder.conv_out has {z2} channels, expected 2 * z_channels = {2 * z}")
    out_ch = get("decoder.conv_out.weight")[0]
    return VaeShape(
        ch=ch, ch_mult=tuple(mult), num_res_blocks=len(blocks), z_channels=z, in_channels=in_channels, out_ch=out_ch
    )
