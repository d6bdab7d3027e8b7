"""BAGEL's image-generation schedule and classifier-free guidance (``Bagel.generate_image``, ``_forward_flow``).

Schedule: ``u = linspace(1, 0, steps)``, shifted ``t = s*u / (1 + (s-1)*u)``; the velocity is evaluated
at ``t_0 .. t_{steps-2}`` (steps - 1 evaluations) and ``x <- x - v * (t_i - t_{i+1})``.

Guidance mixes three velocities of the same latent rows: ``v_cond`` (the full context), ``v_no_text``
(the context without the last text: the ``cfg_text`` branch) and ``v_no_image`` (without the input
images: ``cfg_img``). A branch is on only inside ``interval`` (``lo < t <= hi``) and with its scale
above 1; with the text scale at or below 1 no guidance at all is applied, whatever the image scale
(the reference nests the whole combination under the text branch). The renorm then scales the
result back to at most ``v_cond``'s norm: over the whole [N, C] velocity (``global``), per token
(``channel``), or per token after the text step only (``text_channel``).

All of this is for one image: the ``global`` norm spans all its tokens, so a batched caller combines
each request's rows separately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

RENORM_TYPES = ("global", "channel", "text_channel")
_EPS = 1e-8


@dataclass(frozen=True)
class GuidanceParams:
    """Defaults: ``InterleaveInferencer.gen_image``'s (text-to-image in app.py)."""

    steps: int = 50  # schedule points; steps - 1 velocity evaluations
    timestep_shift: float = 3.0
    text_scale: float = 4.0  # <= 1: no guidance at all
    image_scale: float = 1.5  # <= 1: no image branch
    interval: tuple[float, float] = (0.4, 1.0)  # guidance only for lo < t <= hi
    renorm: str = "global"
    renorm_min: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 2:
            raise ValueError(f"steps must be an integer >= 2 (steps - 1 evaluations), got {self.steps!r}")
        _finite_positive("timestep_shift", self.timestep_shift)
        _finite_positive("text_scale", self.text_scale)
        _finite_positive("image_scale", self.image_scale)
        if len(self.interval) != 2:
            raise ValueError(f"interval must be (lo, hi), got {self.interval!r}")
        lo, hi = (float(v) for v in self.interval)
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError(f"interval must satisfy 0 <= lo <= hi <= 1, got {self.interval!r}")
        if self.renorm not in RENORM_TYPES:
            raise ValueError(f"renorm must be one of {', '.join(RENORM_TYPES)}, got {self.renorm!r}")
        if not (0.0 <= self.renorm_min <= 1.0):
            raise ValueError(
                f"renorm_min must be in [0, 1] (the renorm clamps to [renorm_min, 1]), got {self.renorm_min!r}"
            )


def _finite_positive(field: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a finite number > 0 (<= 1 turns the branch off), got {value!r}")


def timesteps(steps: int, shift: float) -> torch.Tensor:
    """The schedule [steps] in fp32, from 1 down to 0 (the reference's op order, so bit-identical)."""
    if steps < 2:
        raise ValueError(f"steps must be >= 2, got {steps}")
    u = torch.linspace(1, 0, steps)
    return shift * u / (1 + (shift - 1) * u)


def _in_interval(t: float | torch.Tensor, interval: tuple[float, float]) -> bool:
    # The reference compares the fp32 time tensor with Python floats, i.e. in fp32: do the same, so a
    # t equal to fp32(lo) is outside as there.
    t32 = torch.as_tensor(t, dtype=torch.float32)
    return bool((t32 > interval[0]) & (t32 <= interval[1]))


def branches_active(params: GuidanceParams, t: float | torch.Tensor) -> tuple[bool, bool]:
    """(cfg_text branch needed, cfg_img branch needed) at time ``t``. The image branch counts only when
    the text branch is on (the reference computes it otherwise too, then ignores it)."""
    if not _in_interval(t, params.interval) or params.text_scale <= 1.0:
        return False, False
    return True, params.image_scale > 1.0


def combine(
    v_cond: torch.Tensor,
    v_no_text: torch.Tensor | None,
    v_no_image: torch.Tensor | None,
    t: float | torch.Tensor,
    params: GuidanceParams,
) -> torch.Tensor:
    """The guided velocity of one image's latent tokens [N, C]; a branch not active at ``t`` may be None."""
    text_on, image_on = branches_active(params, t)
    if not text_on:
        return v_cond
    if v_no_text is None or (image_on and v_no_image is None):
        raise ValueError(f"guidance at t={float(t):.4f} needs v_no_text{' and v_no_image' if image_on else ''}")
    text_guided = v_no_text + params.text_scale * (v_cond - v_no_text)
    if params.renorm == "text_channel":
        text_guided = text_guided * _renorm_factor(v_cond, text_guided, per_token=True, lo=params.renorm_min)
        if not image_on:
            return text_guided
        return v_no_image + params.image_scale * (text_guided - v_no_image)
    guided = v_no_image + params.image_scale * (text_guided - v_no_image) if image_on else text_guided
    return guided * _renorm_factor(v_cond, guided, per_token=params.renorm == "channel", lo=params.renorm_min)


def _renorm_factor(reference: torch.Tensor, guided: torch.Tensor, *, per_token: bool, lo: float) -> torch.Tensor:
    """||reference|| / (||guided|| + eps), clamped to [lo, 1]: over the last axis or the whole tensor."""
    if per_token:
        ratio = reference.norm(dim=-1, keepdim=True) / (guided.norm(dim=-1, keepdim=True) + _EPS)
    else:
        ratio = reference.norm() / (guided.norm() + _EPS)
    return ratio.clamp(min=lo, max=1.0)
