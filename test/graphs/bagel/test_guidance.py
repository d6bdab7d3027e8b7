"""The flow schedule and CFG combination: hand-checked cases, and parity with the reference's own copy."""

from __future__ import annotations

import math

import pytest
import torch

from mstar_graphs.bagel import reference
from mstar_graphs.bagel.guidance import GuidanceParams, branches_active, combine, timesteps


def test_timesteps_formula():
    assert torch.allclose(timesteps(3, 3.0), torch.tensor([1.0, 0.75, 0.0]))  # u = 1, .5, 0: 3u / (1 + 2u)
    assert torch.equal(timesteps(5, 1.0), torch.linspace(1, 0, 5))  # no shift
    t = timesteps(50, 3.0)
    assert t.shape == (50,) and t.dtype == torch.float32 and t[0] == 1.0 and t[-1] == 0.0
    assert bool((t[:-1] > t[1:]).all())
    assert torch.equal(t, reference.ref_timesteps(50, 3.0))


def test_branches_follow_interval_and_scales():
    p = GuidanceParams()  # (0.4, 1.0], text 4, image 1.5
    assert branches_active(p, 1.0) == (True, True)
    assert branches_active(p, 0.41) == (True, True)
    assert branches_active(p, 0.4) == (False, False)  # lo is excluded
    assert branches_active(p, 0.0) == (False, False)
    assert branches_active(GuidanceParams(image_scale=1.0), 0.9) == (True, False)
    assert branches_active(GuidanceParams(text_scale=1.0, image_scale=2.0), 0.9) == (False, False)
    guided = sum(branches_active(p, float(t))[0] for t in timesteps(50, 3.0)[:-1])
    # t > 0.4 <=> u = 1 - k/49 > 2/11 <=> k <= 40: 41 of the 49 evaluations are guided
    assert guided == 41


def _hand(renorm: str, renorm_min: float = 0.0, image_scale: float = 1.0) -> GuidanceParams:
    return GuidanceParams(
        text_scale=2.0, image_scale=image_scale, interval=(0.0, 1.0), renorm=renorm, renorm_min=renorm_min
    )


def test_hand_checked_global_and_channel():
    vc = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    vt = torch.zeros(2, 2)
    # text step: 0 + 2 * (vc - 0) = 2 vc; global: ||vc|| / ||2 vc|| = 0.5 -> back to vc
    assert torch.allclose(combine(vc, vt, None, 0.5, _hand("global")), vc)
    # clamped from below: factor 0.8 instead of 0.5
    assert torch.allclose(combine(vc, vt, None, 0.5, _hand("global", renorm_min=0.8)), 1.6 * vc)
    # channel: per row, rows of 2 vc are scaled back to vc's rows
    vt2 = torch.tensor([[3.0, 4.0], [0.0, 0.0]])  # first row unguided (a = vc), second doubled
    out = combine(vc, vt2, None, 0.5, _hand("channel"))
    assert torch.allclose(out, vc)
    # global with the same input: a = [[3,4],[0,2]], factor sqrt(26)/sqrt(29)
    out = combine(vc, vt2, None, 0.5, _hand("global"))
    assert torch.allclose(out, torch.tensor([[3.0, 4.0], [0.0, 2.0]]) * math.sqrt(26 / 29))


def test_hand_checked_text_channel_with_image_branch():
    vc = torch.tensor([[1.0, 0.0]])
    vt = torch.tensor([[0.0, 1.0]])
    vi = torch.tensor([[0.0, 0.0]])
    # a = vt + 2 (vc - vt) = [2, -1], renormed per row to ||vc|| = 1: [2, -1] / sqrt(5); then image step x1.5, no renorm
    expected = 1.5 * torch.tensor([[2.0, -1.0]]) / math.sqrt(5)
    assert torch.allclose(combine(vc, vt, vi, 0.5, _hand("text_channel", image_scale=1.5)), expected)


def test_no_text_guidance_means_no_guidance():
    vc, vt, vi = (torch.randn(4, 8, generator=torch.Generator().manual_seed(s)) for s in range(3))
    assert combine(vc, vt, vi, 0.5, GuidanceParams(text_scale=1.0, image_scale=3.0)) is vc
    assert combine(vc, None, None, 0.2, GuidanceParams()) is vc  # outside (0.4, 1]: branches may be absent
    with pytest.raises(ValueError, match="needs v_no_text"):
        combine(vc, None, vi, 0.5, GuidanceParams())


@pytest.mark.parametrize("renorm", ["global", "channel", "text_channel"])
@pytest.mark.parametrize(("text_scale", "image_scale"), [(4.0, 1.5), (4.0, 1.0), (1.0, 2.0), (0.5, 0.5)])
@pytest.mark.parametrize("t", [1.0, 0.7, 0.4, 0.1])
def test_combine_matches_reference(renorm, text_scale, image_scale, t):
    g = torch.Generator().manual_seed(7)
    vc, vt, vi = (torch.randn(6, 64, generator=g) for _ in range(3))
    p = GuidanceParams(text_scale=text_scale, image_scale=image_scale, renorm=renorm, renorm_min=0.2)
    st, si = reference.ref_gated_scales(torch.tensor(t), p)
    expected = reference.ref_combine(vc, vt, vi, st, si, renorm, p.renorm_min)
    assert torch.allclose(combine(vc, vt, vi, t, p), expected, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"steps": 1}, "steps"),
        ({"timestep_shift": 0.0}, "timestep_shift"),
        ({"text_scale": 0.0}, "text_scale"),
        ({"text_scale": float("nan")}, "text_scale"),
        ({"image_scale": -1.0}, "image_scale"),
        ({"interval": (0.8, 0.2)}, "interval"),
        ({"renorm": "local"}, "renorm"),
        ({"renorm_min": 1.5}, "renorm_min"),
    ],
)
def test_bad_params_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GuidanceParams(**kwargs)
