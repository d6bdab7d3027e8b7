"""State normalisation / action unnormalisation against the references' formulas, written out in numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mstar_graphs.pi05.normalization import FeatureNormalizer, Mode, NormalizationError, joint_limits

RNG = np.random.default_rng(7)
X = RNG.uniform(-3, 3, size=(5, 4)).astype(np.float32)
STATS = {
    "mean": RNG.normal(size=4),
    "std": RNG.uniform(0.1, 2, 4),
    "min": -RNG.uniform(1, 2, 4),
    "max": RNG.uniform(1, 2, 4),
    "q01": -RNG.uniform(0.5, 1, 4),
    "q99": RNG.uniform(0.5, 1, 4),
    "q10": -RNG.uniform(0.2, 0.5, 4),
    "q90": RNG.uniform(0.2, 0.5, 4),
}


def _lerobot_reference(mode: str, x: np.ndarray, s: dict, eps: float = 1e-8) -> tuple[np.ndarray, np.ndarray]:
    """LeRobot's NormalizerProcessorStep / UnnormalizerProcessorStep (float32)."""
    s = {k: v.astype(np.float32) for k, v in s.items()}
    if mode == "MEAN_STD":
        return (x - s["mean"]) / (s["std"] + eps), x * s["std"] + s["mean"]
    lo, hi = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}[mode]
    d = s[hi] - s[lo]
    d = np.where(d == 0, np.float32(eps), d)
    return 2 * (x - s[lo]) / d - 1, (x + 1) * d / 2 + s[lo] if mode != "MIN_MAX" else (x + 1) / 2 * d + s[lo]


@pytest.mark.parametrize("mode", ["MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10"])
def test_lerobot_modes(mode):
    need = {
        "MEAN_STD": ("mean", "std"),
        "MIN_MAX": ("min", "max"),
        "QUANTILES": ("q01", "q99"),
        "QUANTILE10": ("q10", "q90"),
    }[mode]
    norm = FeatureNormalizer(Mode(mode), {k: torch.tensor(STATS[k]) for k in need}, "lerobot")
    want_n, want_u = _lerobot_reference(mode, X, STATS)
    assert np.allclose(norm.normalize(torch.from_numpy(X)).numpy(), want_n, rtol=1e-6, atol=1e-6)
    assert np.allclose(norm.unnormalize(torch.from_numpy(X)).numpy(), want_u, rtol=1e-6, atol=1e-6)
    assert norm.normalize(torch.from_numpy(X)).abs().max() > 1.5  # nothing is clamped


def test_openpi_quantiles_and_zscore_in_float64():
    """openpi's transforms.Normalize / Unnormalize: eps 1e-6 inside, float64 statistics."""
    q = FeatureNormalizer(
        Mode.QUANTILES, {"q01": torch.tensor(STATS["q01"]), "q99": torch.tensor(STATS["q99"])}, "openpi"
    )
    x = X.astype(np.float64)
    want = (x - STATS["q01"]) / (STATS["q99"] - STATS["q01"] + 1e-6) * 2.0 - 1.0
    assert np.allclose(q.normalize(torch.from_numpy(X)).numpy(), want, rtol=1e-6, atol=1e-7)
    back = (x + 1.0) / 2.0 * (STATS["q99"] - STATS["q01"] + 1e-6) + STATS["q01"]
    assert np.allclose(q.unnormalize(torch.from_numpy(X)).numpy(), back, rtol=1e-6, atol=1e-7)
    z = FeatureNormalizer(
        Mode.MEAN_STD, {"mean": torch.tensor(STATS["mean"]), "std": torch.tensor(STATS["std"])}, "openpi"
    )
    assert np.allclose(
        z.unnormalize(torch.from_numpy(X)).numpy(), x * (STATS["std"] + 1e-6) + STATS["mean"], rtol=1e-6, atol=1e-7
    )


def test_a_zero_range_uses_eps_as_lerobot_does():
    norm = FeatureNormalizer(
        Mode.QUANTILES, {"q01": torch.tensor([1.0, 0.0]), "q99": torch.tensor([1.0, 2.0])}, "lerobot"
    )
    out = norm.normalize(torch.tensor([1.0, 1.0]))
    assert out.tolist() == [-1.0, 0.0]
    assert norm.unnormalize(torch.tensor([0.5, 0.0])).tolist()[0] == pytest.approx(1.0)


def test_joint_limits_fallback_and_bad_statistics():
    limits = joint_limits([-1.0, 0.0], [1.0, 4.0])
    assert limits.state.normalize(torch.tensor([0.0, 1.0])).tolist() == [0.0, -0.5]
    assert limits.action.unnormalize(torch.tensor([1.0, 3.0])).tolist() == [1.0, 8.0]  # not clamped
    assert not limits.from_checkpoint and "joint limits" in limits.describe()
    with pytest.raises(NormalizationError, match="above joint_lower"):
        joint_limits([0.0], [0.0])
    with pytest.raises(NormalizationError, match=r"missing \['q99'\]"):
        FeatureNormalizer(Mode.QUANTILES, {"q01": torch.zeros(2)}, "lerobot")
    with pytest.raises(NormalizationError, match="NaN"):
        FeatureNormalizer(Mode.MEAN_STD, {"mean": torch.tensor([float("nan")]), "std": torch.ones(1)}, "lerobot")
    with pytest.raises(NormalizationError, match="3 values but the statistics have 2"):
        limits.state.normalize(torch.zeros(3))
