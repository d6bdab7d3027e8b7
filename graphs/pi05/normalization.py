"""State normalisation and action unnormalisation, as the checkpoint's own reference does it.

pi0.5 sees the robot state normalised (then discretised into the prompt) and emits
normalised actions. Released checkpoints carry the statistics and name the mode; the
formulas differ slightly between the two references, so each is followed exactly:

- LeRobot (``NormalizerProcessorStep`` / ``UnnormalizerProcessorStep``, float32, eps from
  the step config, 1e-8 by default)::

      MEAN_STD   (x - mean) / (std + eps)              x * std + mean
      MIN_MAX    2 (x - min) / d - 1, d = max - min    (x + 1) / 2 * d + min
      QUANTILES  2 (x - q01) / d - 1, d = q99 - q01    (x + 1) * d / 2 + q01
      QUANTILE10 the same with q10 / q90
      IDENTITY   x                                     x

  where a zero ``d`` is replaced by eps.
- openpi (``transforms.Normalize`` / ``Unnormalize``, float64 statistics from JSON)::

      z-score    (x - mean) / (std + 1e-6)                  x * (std + 1e-6) + mean
      quantile   (x - q01) / (q99 - q01 + 1e-6) * 2 - 1     (x + 1) / 2 * (q99 - q01 + 1e-6) + q01

  pi0.5 uses the quantile form (openpi: every model but pi0).

Neither clamps, so nothing here clamps. A checkpoint without statistics is scaled by the
robot's joint limits instead (``joint_limits``; our fallback, no reference), and whoever
uses it says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

LEROBOT_EPS = 1e-8
OPENPI_EPS = 1e-6


class NormalizationError(ValueError):
    """Statistics that are missing, malformed, or do not fit the data."""


class Mode(str, enum.Enum):
    """LeRobot's ``NormalizationMode`` names (openpi's two forms map onto MEAN_STD and QUANTILES)."""

    IDENTITY = "IDENTITY"
    MEAN_STD = "MEAN_STD"
    MIN_MAX = "MIN_MAX"
    QUANTILES = "QUANTILES"
    QUANTILE10 = "QUANTILE10"
    JOINT_LIMITS = "JOINT_LIMITS"  # ours: [lower, upper] -> [-1, 1], when the checkpoint has no statistics


#: the two statistics (low, high) or (mean, std) each mode needs
_NEEDS = {
    Mode.MEAN_STD: ("mean", "std"),
    Mode.MIN_MAX: ("min", "max"),
    Mode.QUANTILES: ("q01", "q99"),
    Mode.QUANTILE10: ("q10", "q90"),
    Mode.JOINT_LIMITS: ("lower", "upper"),
    Mode.IDENTITY: (),
}


@dataclass(frozen=True)
class FeatureNormalizer:
    """One feature's (``observation.state`` or ``action``) normaliser, in one reference's flavour."""

    mode: Mode
    stats: dict[str, torch.Tensor]  # the two statistics the mode needs, [D] each
    flavour: str  # "lerobot" | "openpi" | "limits"
    eps: float = LEROBOT_EPS

    def __post_init__(self) -> None:
        names = _NEEDS[self.mode]
        missing = [n for n in names if n not in self.stats]
        if missing:
            raise NormalizationError(
                f"{self.mode.value} normalisation needs statistics {list(names)}; missing {missing}"
            )
        shapes = {tuple(self.stats[n].shape) for n in names}
        if len(shapes) > 1 or any(len(s) != 1 for s in shapes):
            raise NormalizationError(
                f"statistics {list(names)} must be vectors of one length, got shapes {sorted(shapes)}"
            )
        for n in names:
            if not torch.isfinite(self.stats[n]).all():
                raise NormalizationError(f"statistic {n!r} has NaN or infinite values")

    @property
    def dim(self) -> int | None:
        names = _NEEDS[self.mode]
        return None if not names else int(self.stats[names[0]].shape[0])

    def _operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, low, high, the range low -> high) in the reference's precision: openpi adds its eps to
        the range (float64), LeRobot replaces a zero range by its eps (float32)."""
        low_name, high_name = _NEEDS[self.mode]
        dtype = torch.float64 if self.flavour == "openpi" else torch.float32
        low, high = self.stats[low_name].to(dtype), self.stats[high_name].to(dtype)
        if x.shape[-1] != low.shape[0]:
            raise NormalizationError(f"{x.shape[-1]} values but the statistics have {low.shape[0]} dims")
        span = high - low
        span = (
            span + OPENPI_EPS
            if self.flavour == "openpi"
            else torch.where(span == 0, torch.as_tensor(self.eps, dtype=dtype), span)
        )
        return x.to(dtype), low, high, span

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """[..., D] raw -> normalised (float32; openpi's float64 arithmetic, then float32)."""
        if self.mode is Mode.IDENTITY:
            return x.float()
        x, low, high, span = self._operands(x)
        if self.mode is Mode.MEAN_STD:  # low, high = mean, std
            return ((x - low) / (high + (OPENPI_EPS if self.flavour == "openpi" else self.eps))).float()
        return (2.0 * (x - low) / span - 1.0).float()

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """[..., D] normalised -> raw (float32)."""
        if self.mode is Mode.IDENTITY:
            return x.float()
        x, low, high, span = self._operands(x)
        if self.mode is Mode.MEAN_STD:  # LeRobot's inverse has no eps, openpi's has
            return (x * (high + OPENPI_EPS if self.flavour == "openpi" else high) + low).float()
        return ((x + 1.0) / 2.0 * span + low).float()


@dataclass(frozen=True)
class Normalization:
    """The state's and the actions' normalisers, and where they came from (for logs and ``checkpoint info``)."""

    state: FeatureNormalizer
    action: FeatureNormalizer
    source: str  # a file, or "joint limits (...)"

    @property
    def from_checkpoint(self) -> bool:
        return self.state.flavour != "limits"

    def describe(self) -> str:
        if self.state.mode == self.action.mode:
            return f"{self.state.mode.value} (state and actions) from {self.source}"
        return f"state {self.state.mode.value}, actions {self.action.mode.value} from {self.source}"


def joint_limits(lower: list[float], upper: list[float]) -> Normalization:
    """The fallback for a checkpoint without statistics: joint limits map to [-1, 1], both ways."""
    lo, hi = torch.tensor(lower, dtype=torch.float32), torch.tensor(upper, dtype=torch.float32)
    if lo.shape != hi.shape or lo.dim() != 1 or lo.numel() == 0:
        raise NormalizationError(
            f"joint_lower and joint_upper must be non-empty and of one length, got {len(lower)} and {len(upper)}"
        )
    if not (hi > lo).all():
        bad = [i for i, ok in enumerate((hi > lo).tolist()) if not ok]
        raise NormalizationError(f"joint_upper must be above joint_lower; not at indices {bad}")
    norm = FeatureNormalizer(Mode.JOINT_LIMITS, {"lower": lo, "upper": hi}, "limits", eps=0.0)
    return Normalization(norm, norm, "joint limits (joint_lower / joint_upper: the checkpoint has no statistics)")
