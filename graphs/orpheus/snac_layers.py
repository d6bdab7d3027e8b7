"""Building blocks of the SNAC decoder (inference only).

Every parameter has the same name as in the reference ``snac`` package's
``state_dict`` so real checkpoints load without renaming. Weight-normalised
convolutions keep the (g, v) pair under ``parametrizations.weight.original0/1``
until :meth:`WNConv.fold` replaces it with one plain ``weight``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar_graphs.common.rope import rope_inv_freq


class _WeightNormPair(nn.Module):
    """Holds ``original0`` (magnitude g) and ``original1`` (direction v) like torch's parametrization."""

    def __init__(self, weight_shape: tuple[int, ...]) -> None:
        super().__init__()
        g_shape = (weight_shape[0],) + (1,) * (len(weight_shape) - 1)
        self.original0 = nn.Parameter(torch.ones(g_shape))
        self.original1 = nn.Parameter(torch.zeros(weight_shape))

    def weight(self) -> torch.Tensor:
        v = self.original1
        # Weight norm with dim=0: normalise each slice along dim 0 (out channels for Conv1d,
        # in channels for ConvTranspose1d, matching the layout of the stored weight).
        norm = v.norm(dim=tuple(range(1, v.dim())), keepdim=True)
        return v * (self.original0 / norm)


class WNConv(nn.Module):
    """Conv1d or ConvTranspose1d with weight norm that can be folded away after loading."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        transposed: bool = False,
        output_padding: int = 0,
    ) -> None:
        super().__init__()
        if transposed:
            shape = (in_channels, out_channels // groups, kernel_size)
        else:
            shape = (out_channels, in_channels // groups, kernel_size)
        self.transposed = transposed
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.output_padding = groups, output_padding
        self.parametrizations = nn.ModuleDict({"weight": _WeightNormPair(shape)})
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.weight: torch.Tensor | None = None

    @property
    def folded(self) -> bool:
        return "parametrizations" not in self._modules

    @torch.no_grad()
    def fold(self) -> None:
        """Replace (g, v) by the plain weight g * v / ||v|| so inference does no norm math."""
        if self.folded:
            return
        pair = self.parametrizations["weight"]
        weight = pair.weight().detach().clone()
        del self.parametrizations
        del self.weight  # the None placeholder attribute
        self.weight = nn.Parameter(weight, requires_grad=False)

    def resolved_weight(self) -> torch.Tensor:
        """The conv weight in use: the folded one, or g * v / ||v|| computed on the fly."""
        return self.weight if self.folded else self.parametrizations["weight"].weight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.resolved_weight()
        if self.transposed:
            return F.conv_transpose1d(
                x, weight, self.bias, self.stride, self.padding, self.output_padding, self.groups, self.dilation
            )
        return F.conv1d(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Snake1d(nn.Module):
    """Snake activation x + sin^2(alpha * x) / alpha, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha
        # The 1e-9 keeps the reference's guard against alpha == 0 (same numerics).
        return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, kernel: int = 7, groups: int = 1) -> None:
        super().__init__()
        pad = ((kernel - 1) * dilation) // 2
        self.block = nn.Sequential(
            Snake1d(dim),
            WNConv(dim, dim, kernel, dilation=dilation, padding=pad, groups=groups),
            Snake1d(dim),
            WNConv(dim, dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        # Same-length convs in practice; the crop only matters for even kernels.
        pad = (x.shape[-1] - y.shape[-1]) // 2
        if pad > 0:
            x = x[..., pad:-pad]
        return x + y


class NoiseBlock(nn.Module):
    """Adds ``noise * linear(x)``; the noise [B, 1, T] is passed in so callers control randomness."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = WNConv(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        if noise.shape != (x.shape[0], 1, x.shape[-1]):
            raise ValueError(f"NoiseBlock: noise shape {tuple(noise.shape)} != expected {(x.shape[0], 1, x.shape[-1])}")
        return x + noise.to(dtype=x.dtype, device=x.device) * self.linear(x)


class DecoderBlock(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, stride: int, noise: bool, groups: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            Snake1d(input_dim),
            WNConv(
                input_dim,
                output_dim,
                2 * stride,
                stride=stride,
                padding=math.ceil(stride / 2),
                output_padding=stride % 2,
                transposed=True,
            ),
        ]
        if noise:
            layers.append(NoiseBlock(output_dim))
        layers += [ResidualUnit(output_dim, dilation=d, groups=groups) for d in (1, 3, 9)]
        self.block = nn.ModuleList(layers)
        self.has_noise = noise

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        for layer in self.block:
            if isinstance(layer, NoiseBlock):
                if noise is None:
                    raise ValueError("DecoderBlock: this decoder has noise blocks; pass noise tensors")
                x = layer(x, noise)
            else:
                x = layer(x)
        return x


def _inv_freq(dim_head: int, device: torch.device | None = None) -> torch.Tensor:
    return rope_inv_freq(dim_head, 10000, device)


class RotaryTable(nn.Module):
    """Rotary-embedding frequencies.

    ``inv_freq`` is a persistent buffer in the reference checkpoint, so it is kept
    for name-compatible loading, but the tables are recomputed in fp32: the buffer
    is a fixed function of ``dim_head`` and would lose precision if the module
    were cast to bf16/fp16.
    """

    def __init__(self, dim_head: int) -> None:
        super().__init__()
        self.dim_head = dim_head
        self.register_buffer("inv_freq", _inv_freq(dim_head))

    def cos_sin(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(n, device=device, dtype=torch.float32)
        freqs = torch.outer(t, _inv_freq(self.dim_head, device))
        freqs = torch.cat((freqs, freqs), dim=-1)
        return freqs.cos(), freqs.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LocalMHA(nn.Module):
    """Windowed self-attention with rotary positions inside each non-overlapping window."""

    def __init__(self, dim: int, window_size: int, dim_head: int = 64) -> None:
        super().__init__()
        if dim < dim_head:
            raise ValueError(f"LocalMHA: dim {dim} is smaller than the head size {dim_head}")
        self.norm = nn.LayerNorm(dim)
        self.heads = dim // dim_head
        self.dim_head = dim_head
        self.window_size = window_size
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.rel_pos = RotaryTable(dim_head)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        if t % self.window_size != 0:
            raise ValueError(f"LocalMHA: length {t} is not a multiple of the attention window {self.window_size}")
        residual = x
        h = self.norm(x.transpose(1, 2))
        w, n = t // self.window_size, self.window_size

        def split(z: torch.Tensor) -> torch.Tensor:  # [B, T, H*D] -> [B, H, W, N, D]
            return z.reshape(b, w, n, self.heads, -1).permute(0, 3, 1, 2, 4)

        q, k, v = (split(z) for z in self.to_qkv(h).chunk(3, dim=-1))
        cos, sin = self.rel_pos.cos_sin(n, x.device)
        # Rotary tables are fp32; compute the rotation in fp32 as the reference does, then cast back.
        q = (q * cos + _rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + _rotate_half(k) * sin).to(v.dtype)
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.permute(0, 2, 3, 1, 4).reshape(b, t, c)
        return self.to_out(out).transpose(1, 2) + residual
