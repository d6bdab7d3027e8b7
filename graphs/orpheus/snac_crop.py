"""Receptive-field cropping for the SNAC decoder: compute only the output samples that are kept.

The Orpheus stage decodes a 4-frame window (8192 samples) but keeps 2048 of them.
Every decoder layer is local in time, so an output range ``[a, b)`` depends on a
bounded input range. :func:`plan_crop` walks the decoder from the end backwards
and records, for every intermediate activation, the range of it that the kept
samples need; :func:`run_crop` then runs the layers on those ranges only.

Exactness. A cropped activation carries real values on its whole range (a halo
included), so a conv never sees zero padding where the full computation sees
real values. Convs therefore run WITHOUT their built-in padding; zeros are added
by hand only where the needed range crosses the true sequence boundary (0 or the
full length), which is exactly what the built-in padding does in the full
computation. Transposed convs need no padding at all: inputs outside the
sequence contribute nothing; the cropped output is shifted into place (and, only
where no real input contributes, filled with the bias). Local attention uses
non-overlapping windows with window-relative rotary positions, so crops rounded
out to whole windows are exact too. Noise tensors are drawn for the full length
by the caller (the random stream is unchanged) and sliced here.

The result equals ``decode(...)[..., a:b]`` up to float reassociation (convs of
different lengths may pick different kernels/blocking).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mstar_graphs.orpheus.snac_layers import DecoderBlock, LocalMHA, NoiseBlock, ResidualUnit, Snake1d, WNConv

Span = tuple[int, int]


class CropUnsupported(Exception):
    """The decoder has a layer whose receptive field this module cannot crop exactly."""


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


# ---- per-layer geometry ---------------------------------------------------------------------


def _conv_out_len(conv: WNConv, length: int) -> int:
    k = conv.resolved_weight().shape[-1]
    s, p, d = conv.stride, conv.padding, conv.dilation
    if conv.transposed:
        return (length - 1) * s - 2 * p + d * (k - 1) + conv.output_padding + 1
    return (length + 2 * p - d * (k - 1) - 1) // s + 1


def _conv_need(conv: WNConv, a: int, b: int) -> Span:
    """Input positions (unclipped: may extend past the sequence) that outputs [a, b) read."""
    k = conv.resolved_weight().shape[-1]
    s, p, d = conv.stride, conv.padding, conv.dilation
    if conv.transposed:
        # y[t] = sum_j x[i] w[j] over t = i*s - p + j*d, j in [0, k)
        return _ceil_div(a + p - d * (k - 1), s), (b - 1 + p) // s + 1
    # y[t] = sum_j x[t*s - p + j*d] w[j]
    return a * s - p, (b - 1) * s - p + d * (k - 1) + 1


def _residual_geometry(unit: ResidualUnit, length: int) -> tuple[WNConv, int, int]:
    """(the unit's dilated conv, output length, left crop of the skip path) as in ResidualUnit.forward."""
    conv = unit.block[1]
    if not isinstance(conv, WNConv) or conv.transposed or conv.stride != 1:
        raise CropUnsupported("ResidualUnit with an unexpected conv")
    out = _conv_out_len(conv, length)
    if (length - out) % 2:
        raise CropUnsupported("ResidualUnit whose conv shortens the sequence by an odd amount")
    return conv, out, max(0, (length - out) // 2)


def _out_len(op: nn.Module, length: int) -> int:
    if isinstance(op, WNConv):
        return _conv_out_len(op, length)
    if isinstance(op, ResidualUnit):
        return _residual_geometry(op, length)[1]
    if isinstance(op, LocalMHA):
        if length % op.window_size:
            raise CropUnsupported(f"length {length} is not a multiple of the attention window")
        return length
    if isinstance(op, (Snake1d, NoiseBlock, nn.Tanh, nn.Identity)):
        return length
    raise CropUnsupported(f"no cropping rule for {type(op).__name__}")


def _need(op: nn.Module, a: int, b: int, length: int) -> Span:
    """Unclipped input span that output span [a, b) of ``op`` (input length ``length``) depends on."""
    if isinstance(op, WNConv):
        return _conv_need(op, a, b)
    if isinstance(op, ResidualUnit):
        conv, _, skip = _residual_geometry(op, length)
        lo, hi = _conv_need(conv, a, b)
        return min(lo, a + skip), max(hi, b + skip)
    if isinstance(op, LocalMHA):
        w = op.window_size
        return (a // w) * w, _ceil_div(b, w) * w
    return a, b  # pointwise


def _clip(span: Span, length: int) -> Span:
    """``span`` clipped to the sequence [0, length); never empty.

    A need can be empty (outputs no input reaches: a transposed conv's gaps, or a
    conv reading only padding). A spare position is kept instead so every
    activation stays non-empty; the runners slice to the exact need, so extra
    input never changes a result.
    """
    lo, hi = max(span[0], 0), min(span[1], length)
    if lo >= hi:
        lo = min(lo, length - 1)
        hi = lo + 1
    return lo, hi


# ---- plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CropPlan:
    """Layers in order with, for each, its input length and the (clipped) input span it receives.

    ``spans[i]`` is the span of the activation entering ``ops[i]``; ``spans[-1]`` is the output span.
    ``noise_index[i]`` names the noise tensor of a NoiseBlock (else None).
    """

    ops: tuple[nn.Module, ...]
    noise_index: tuple[int | None, ...]
    lengths: tuple[int, ...]
    spans: tuple[Span, ...]

    def work_fraction(self) -> list[float]:
        """Per layer: cropped input length / full input length (a rough guide to the saving)."""
        return [(hi - lo) / n for (lo, hi), n in zip(self.spans[:-1], self.lengths[:-1])]


def _flatten(model: Sequence[nn.Module]) -> tuple[list[nn.Module], list[int | None]]:
    ops: list[nn.Module] = []
    noise_index: list[int | None] = []
    block = 0
    for layer in model:
        if isinstance(layer, DecoderBlock):
            for sub in layer.block:
                ops.append(sub)
                noise_index.append(block if isinstance(sub, NoiseBlock) else None)
            block += 1
        else:
            ops.append(layer)
            noise_index.append(None)
    return ops, noise_index


def plan_crop(model: Sequence[nn.Module], latent_len: int, start: int, end: int) -> CropPlan:
    """Plan the cropped run of the decoder layers ``model`` for output samples [start, end).

    Raises :class:`CropUnsupported` if a layer cannot be cropped exactly.
    """
    ops, noise_index = _flatten(model)
    lengths = [latent_len]
    for op in ops:
        lengths.append(_out_len(op, lengths[-1]))
    if not 0 <= start < end <= lengths[-1]:
        raise ValueError(f"crop range [{start}, {end}) is outside the {lengths[-1]} decoded samples")
    spans: list[Span] = [(start, end)]
    for op, n_in in zip(reversed(ops), reversed(lengths[:-1])):
        spans.append(_clip(_need(op, *spans[-1], n_in), n_in))
    spans.reverse()
    return CropPlan(tuple(ops), tuple(noise_index), tuple(lengths), tuple(spans))


# ---- execution ------------------------------------------------------------------------------


def _conv_range(conv: WNConv, x: torch.Tensor, x_span: Span, length: int, out: Span) -> torch.Tensor:
    """Outputs ``out`` of ``conv`` given its input restricted to ``x_span`` (which covers the need)."""
    weight = conv.resolved_weight()
    lo, hi = _conv_need(conv, *out)
    if conv.transposed:
        # Inputs outside [0, length) contribute nothing; run unpadded and shift the result into place.
        y = F.conv_transpose1d(x, weight, conv.bias, conv.stride, 0, 0, conv.groups, conv.dilation)
        first = x_span[0] * conv.stride - conv.padding  # full-output position of y[..., 0]
        u0, u1 = out[0] - first, out[1] - first
        if u0 >= 0 and u1 <= y.shape[-1]:
            return y[..., u0:u1]
        # Positions no input reaches (e.g. output_padding): the full conv gives just the bias there.
        n = y.shape[-1]
        left, right = max(0, min(u1, 0) - u0), max(0, u1 - max(u0, n))
        c0 = max(u0, 0)
        y = F.pad(y[..., c0 : max(min(u1, n), c0)], (left, right))
        if conv.bias is not None:
            fill = torch.zeros_like(y[:1, :, :])
            fill[..., :left] = 1
            if right:
                fill[..., -right:] = 1
            y = y + fill * conv.bias.view(1, -1, 1)
        return y
    c_lo, c_hi = min(max(lo, 0), length), max(min(hi, length), 0)
    if c_lo < c_hi:
        x = x[..., c_lo - x_span[0] : c_hi - x_span[0]]
        left, right = c_lo - lo, hi - c_hi
    else:  # reads only padding
        x, left, right = x[..., :0], hi - lo, 0
    if left or right:
        x = F.pad(x, (left, right))  # zeros only beyond the true sequence boundary
    return F.conv1d(x, weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)


def _residual_range(unit: ResidualUnit, x: torch.Tensor, x_span: Span, length: int, out: Span) -> torch.Tensor:
    snake1, conv, snake2, conv2 = unit.block
    _, _, skip = _residual_geometry(unit, length)
    lo, hi = _clip(_conv_need(conv, *out), length)
    h = snake1(x[..., lo - x_span[0] : hi - x_span[0]])
    h = _conv_range(conv, h, (lo, hi), length, out)
    h = conv2(snake2(h))
    a, b = out[0] + skip - x_span[0], out[1] + skip - x_span[0]
    return x[..., a:b] + h


def run_crop(plan: CropPlan, z: torch.Tensor, noise: Sequence[torch.Tensor] | None) -> torch.Tensor:
    """Run the planned layers on the full latent ``z`` [B, C, latent_len]; returns [B, 1, end - start]."""
    if z.shape[-1] != plan.lengths[0]:
        raise ValueError(f"run_crop: latent length {z.shape[-1]} != planned {plan.lengths[0]}")
    x_span = plan.spans[0]
    x = z[..., x_span[0] : x_span[1]]
    for op, block, length, out in zip(plan.ops, plan.noise_index, plan.lengths, plan.spans[1:]):
        if isinstance(op, WNConv):
            x = _conv_range(op, x, x_span, length, out)
        elif isinstance(op, ResidualUnit):
            x = _residual_range(op, x, x_span, length, out)
        elif isinstance(op, LocalMHA):
            # x_span is window-aligned (length is a multiple of the window): window positions match.
            x = op(x)[..., out[0] - x_span[0] : out[1] - x_span[0]]
        elif isinstance(op, NoiseBlock):
            if noise is None:
                raise ValueError("run_crop: this decoder has noise blocks; pass noise tensors")
            full = noise[block]
            if full.shape[-1] != length:
                raise ValueError(f"run_crop: noise {block} has length {full.shape[-1]}, expected the full length")
            x = op(x, full[..., out[0] : out[1]])
        else:  # pointwise
            x = op(x)
        x_span = out
    return x
