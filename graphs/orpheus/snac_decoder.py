"""SNAC decoder: codes -> 24 kHz (or other rate) waveform, inference only.

Holds only what decoding needs: the quantizer's code -> latent path and the
decoder network. Parameter names equal the reference ``snac`` package's
``state_dict`` names (``quantizer.*``, ``decoder.*``) so the real checkpoint
loads with a name map that only drops the encoder and the quantizer's
``in_proj`` (used for encoding only).

Noise: the reference draws ``torch.randn((B, 1, T))`` inside every noise block.
Here noise is an explicit input; :meth:`SnacDecoder.make_noise` draws it in the
same order, shapes and dtype, so a ``torch.Generator`` seeded with ``s``
reproduces ``torch.manual_seed(s); snac.SNAC.decode(...)`` exactly on CPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from mstar_graphs.orpheus.snac_config import SnacConfig
from mstar_graphs.orpheus.snac_crop import CropPlan, CropUnsupported, plan_crop, run_crop
from mstar_graphs.orpheus.snac_layers import DecoderBlock, LocalMHA, Snake1d, WNConv


class VectorQuantizerDecode(nn.Module):
    """One quantizer level: code -> codebook vector -> out_proj -> repeat by stride."""

    def __init__(self, latent_dim: int, codebook_size: int, codebook_dim: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.codebook = nn.Embedding(codebook_size, codebook_dim)
        self.out_proj = WNConv(codebook_dim, latent_dim, 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.codebook(codes).transpose(1, 2)  # [B, D, T_l]
        z = self.out_proj(z)
        return z.repeat_interleave(self.stride, dim=-1) if self.stride > 1 else z


class QuantizerDecode(nn.Module):
    def __init__(self, config: SnacConfig) -> None:
        super().__init__()
        latent = config.resolved_latent_dim
        self.quantizers = nn.ModuleList(
            VectorQuantizerDecode(latent, config.codebook_size, config.codebook_dim, s) for s in config.vq_strides
        )

    def forward(self, codes: Sequence[torch.Tensor]) -> torch.Tensor:
        z = None
        for level, (q, c) in enumerate(zip(self.quantizers, codes)):
            z_l = q(c)
            if z is not None and z_l.shape[-1] != z.shape[-1]:
                raise ValueError(
                    f"SNAC level {level}: {c.shape[-1]} codes x stride {q.stride} = {z_l.shape[-1]} latent frames, "
                    f"but level 0 gives {z.shape[-1]}"
                )
            z = z_l if z is None else z + z_l
        assert z is not None
        return z


class Decoder(nn.Module):
    def __init__(self, config: SnacConfig) -> None:
        super().__init__()
        latent, channels = config.resolved_latent_dim, config.decoder_dim
        layers: list[nn.Module]
        if config.depthwise:
            layers = [WNConv(latent, latent, 7, padding=3, groups=latent), WNConv(latent, channels, 1)]
        else:
            layers = [WNConv(latent, channels, 7, padding=3)]
        if config.attn_window_size is not None:
            layers.append(LocalMHA(channels, config.attn_window_size))
        out_dim = channels
        for i, stride in enumerate(config.decoder_rates):
            in_dim, out_dim = channels // 2**i, channels // 2 ** (i + 1)
            groups = out_dim if config.depthwise else 1
            layers.append(DecoderBlock(in_dim, out_dim, stride, config.noise, groups))
        layers += [Snake1d(out_dim), WNConv(out_dim, 1, 7, padding=3), nn.Tanh()]
        # ModuleList (not Sequential) so noise can be threaded through; indices match the reference.
        self.model = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, noise: Sequence[torch.Tensor] | None) -> torch.Tensor:
        block = 0
        for layer in self.model:
            if isinstance(layer, DecoderBlock):
                x = layer(x, noise[block] if noise is not None else None)
                block += 1
            else:
                x = layer(x)
        return x


def checkpoint_name_map(name: str) -> str | None:
    """Map a SNAC checkpoint tensor name to our module name; None skips it.

    Accepts both weight-norm spellings: torch's parametrization
    (``.parametrizations.weight.original0/1``, snac >= 1.2) and the legacy
    ``.weight_g`` / ``.weight_v`` of older ``torch.nn.utils.weight_norm``.
    """
    if name.startswith("encoder.") or re.match(r"quantizer\.quantizers\.\d+\.in_proj\.", name):
        return None  # encoding-only weights
    if name.endswith(".weight_g"):
        return name[: -len(".weight_g")] + ".parametrizations.weight.original0"
    if name.endswith(".weight_v"):
        return name[: -len(".weight_v")] + ".parametrizations.weight.original1"
    return name


class SnacDecoder(nn.Module):
    """SNAC codes -> audio. ``decode(codes, noise)`` returns [B, 1, samples]."""

    def __init__(self, config: SnacConfig) -> None:
        super().__init__()
        self.config = config
        self.quantizer = QuantizerDecode(config)
        self.decoder = Decoder(config)
        # (latent_len, start, end) -> CropPlan, or None where cropping is unsupported.
        self._crop_plans: dict[tuple[int, int, int], CropPlan | None] = {}

    # ---- shapes -------------------------------------------------------------------------

    def latent_frames(self, num_fine_codes: int) -> int:
        """Latent length for ``num_fine_codes`` codes of the finest (last) level."""
        return num_fine_codes * self.config.vq_strides[-1]

    def num_samples(self, num_fine_codes: int) -> int:
        return self.latent_frames(num_fine_codes) * math.prod(self.config.decoder_rates)

    def noise_shapes(self, batch: int, num_fine_codes: int) -> list[tuple[int, int, int]]:
        """Shapes of the noise tensors, in the order the reference draws them (one per decoder block).

        ``num_fine_codes`` counts codes of the finest level (level 2 for the 24 kHz model).
        Empty when the config has no noise blocks.
        """
        if not self.config.noise:
            return []
        t = self.latent_frames(num_fine_codes)
        shapes = []
        for stride in self.config.decoder_rates:
            t *= stride  # a decoder block's transposed conv upsamples by exactly its stride
            shapes.append((batch, 1, t))
        return shapes

    def make_noise(
        self,
        generator: torch.Generator | None,
        batch: int,
        num_fine_codes: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> list[torch.Tensor]:
        """Draw the decoder's noise from ``generator`` in the reference's order and shapes.

        Draws in ``dtype`` (float32 by default, like the reference in fp32) on the
        generator's device, then moves to ``device`` so results do not depend on
        where the model runs.
        """
        gen_device = generator.device if generator is not None else torch.device("cpu")
        out = []
        for shape in self.noise_shapes(batch, num_fine_codes):
            n = torch.randn(shape, generator=generator, dtype=dtype, device=gen_device)
            out.append(n.to(device) if device is not None else n)
        return out

    # ---- inference ----------------------------------------------------------------------

    def _check_inputs(self, codes: Sequence[torch.Tensor], noise: Sequence[torch.Tensor] | None, what: str) -> int:
        if len(codes) != self.config.n_levels:
            raise ValueError(f"SnacDecoder.{what}: expected {self.config.n_levels} code levels, got {len(codes)}")
        n_blocks = len(self.config.decoder_rates) if self.config.noise else 0
        if n_blocks and (noise is None or len(noise) != n_blocks):
            got = "none" if noise is None else len(noise)
            raise ValueError(
                f"SnacDecoder.{what}: expected {n_blocks} noise tensors (one per decoder block), got {got}"
            )
        return n_blocks

    def decode(self, codes: Sequence[torch.Tensor], noise: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """codes: one int tensor [B, T_l] per level (coarse first) -> audio [B, 1, samples] in [-1, 1].

        ``noise`` must be given (see :meth:`make_noise`) when the config has noise blocks.
        """
        n_blocks = self._check_inputs(codes, noise, "decode")
        z = self.quantizer(codes)
        return self.decoder(z, noise if n_blocks else None)

    def crop_plan(self, latent_len: int, start: int, end: int) -> CropPlan | None:
        """The (cached) receptive-field plan for samples [start, end); None if this config cannot be cropped."""
        key = (latent_len, start, end)
        if key not in self._crop_plans:
            try:
                plan: CropPlan | None = plan_crop(self.decoder.model, latent_len, start, end)
            except CropUnsupported:
                plan = None
            self._crop_plans[key] = plan
        return self._crop_plans[key]

    def decode_range(
        self, codes: Sequence[torch.Tensor], noise: Sequence[torch.Tensor] | None, start: int, end: int
    ) -> torch.Tensor:
        """``decode(codes, noise)[..., start:end]``, computing only what those samples depend on.

        Every activation is cropped to the receptive field of the kept samples (see
        :mod:`snac_crop`); ``noise`` is the full-length noise of :meth:`make_noise`,
        sliced internally. Equal to the full decode up to float reassociation. Falls
        back to the full decode where a layer cannot be cropped exactly.
        """
        n_blocks = self._check_inputs(codes, noise, "decode_range")
        z = self.quantizer(codes)
        total = z.shape[-1] * math.prod(self.config.decoder_rates)
        if not 0 <= start < end <= total:
            raise ValueError(f"SnacDecoder.decode_range: [{start}, {end}) is outside the {total} decoded samples")
        plan = self.crop_plan(z.shape[-1], start, end)
        if plan is None:
            return self.decoder(z, noise if n_blocks else None)[..., start:end]
        return run_crop(plan, z, noise if n_blocks else None)

    def forward(self, codes: Sequence[torch.Tensor], noise: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        return self.decode(codes, noise)

    # ---- loading ------------------------------------------------------------------------

    @torch.no_grad()
    def fold_weight_norm(self) -> SnacDecoder:
        """Fold every weight-normalised conv into a plain weight (once, after loading)."""
        for module in self.modules():
            if isinstance(module, WNConv):
                module.fold()
        return self

    @classmethod
    def from_pretrained_dir(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = True
    ) -> SnacDecoder:
        """Load config.json + weights (model.safetensors or pytorch_model.bin), fold weight norm, cast.

        Weights are loaded and folded in float32, then cast to ``dtype``, so the
        fold itself never loses precision.
        """
        from mstar.weights import load_weights

        path = Path(path)
        config = SnacConfig.from_dir(path)
        model = cls(config)
        load_weights(
            model,
            path,
            name_map=checkpoint_name_map,
            dtype=torch.float32,
            strict=True,
            progress=progress,
            desc="snac decoder",
        )
        model.fold_weight_norm()
        return model.to(dtype).eval().requires_grad_(False)
