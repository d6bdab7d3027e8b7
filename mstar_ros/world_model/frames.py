"""Which camera frames extend a world model's session, and the state that goes with each.

V-JEPA 2-AC was trained on frames 1 / fps apart (DROID at 4 fps); a camera publishes faster
(15 Hz). A frame is taken when its ``header.stamp`` is at least one period (less a little
jitter slack) after the last one taken; a stamp further back than ``max_back_s`` means the
clock went back (a bag looped under sim time), and picking starts over from it.

Its state is the newest end-effector pose (x, y, z, extrinsic xyz angles from the quaternion)
and gripper position scaled to [0, 1]. Readings are checked when they arrive, so a bad one
never stands in for the last good one and never reaches the model: a pose must be finite,
within ``max_position_m`` of the base frame's origin on each axis (x = 1e300 is inf in float32)
and a unit quaternion; a gripper position finite and within half its range of [0,
gripper_max] (a little past either end is clipped: driver noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mstar_graphs.vjepa2.pose import quaternion_to_euler

JITTER_SLACK = 0.1  # a frame up to 10% of a period early still counts as the next one
GRIPPER_SLACK = 0.5  # a gripper reading this far (x gripper_max) outside [0, gripper_max] is not a reading


class StateError(ValueError):
    pass


@dataclass
class FramePicker:
    fps: float
    max_back_s: float = math.inf
    last_stamp: float | None = None

    def due(self, stamp: float) -> bool:
        """Whether the frame stamped ``stamp`` (s) is the session's next one (and marks it taken)."""
        period = 1.0 / self.fps
        last = self.last_stamp
        if last is not None and last - self.max_back_s <= stamp < last + period * (1 - JITTER_SLACK):
            return False
        self.last_stamp = stamp
        return True

    def reset(self) -> None:
        self.last_stamp = None


def check_pose(
    position: tuple[float, float, float],
    orientation: tuple[float, float, float, float],
    *,
    topic: str,
    max_position_m: float,
) -> None:
    """Raises StateError unless the pose can be a state: see the module's docstring."""
    for axis, value in zip("xyz", position):
        if not math.isfinite(value):
            raise StateError(f"{topic}: position {axis} {value:g} is not finite")
        if abs(value) > max_position_m:
            raise StateError(
                f"{topic}: position {axis} {value:g} is over max_position_m={max_position_m:g} from "
                "the base frame's origin"
            )
    if not all(math.isfinite(q) for q in orientation):
        raise StateError(f"{topic}: orientation has NaN or infinite values")
    _check_unit(orientation, topic)


def _check_unit(orientation: tuple[float, float, float, float], topic: str) -> None:
    norm = math.sqrt(sum(q * q for q in orientation))
    if not 0.5 < norm < 1.5:
        raise StateError(f"{topic}: orientation is not a unit quaternion (norm {norm:.3g})")


def gripper_state(position: float, gripper_max: float, *, topic: str) -> float:
    """A gripper joint position as the state's gripper value in [0, 1] (StateError when it is no reading)."""
    if not math.isfinite(position):
        raise StateError(f"{topic}: gripper position {position:g} is not finite")
    value = position / gripper_max
    if not -GRIPPER_SLACK <= value <= 1 + GRIPPER_SLACK:
        raise StateError(
            f"{topic}: gripper position {position:g} is outside [{-GRIPPER_SLACK:g}, "
            f"{1 + GRIPPER_SLACK:g}] x gripper_max={gripper_max:g}"
        )
    return min(max(value, 0.0), 1.0)


def pose_state(
    position: tuple[float, float, float], orientation: tuple[float, float, float, float], gripper: float, *, topic: str
) -> torch.Tensor:
    """[x, y, z, roll, pitch, yaw, gripper]: orientation as geometry_msgs orders it (x, y, z, w)."""
    values = [*position, *orientation, gripper]
    if not all(math.isfinite(v) for v in values):
        raise StateError(f"{topic}: pose or gripper has NaN or infinite values")
    _check_unit(orientation, topic)
    euler = quaternion_to_euler(torch.tensor(orientation, dtype=torch.float64))
    state = torch.tensor([*position, *euler.tolist(), min(max(gripper, 0.0), 1.0)], dtype=torch.float32)
    if not bool(torch.isfinite(state).all()):  # finite in float64 but not in float32 (|x| > 3.4e38)
        raise StateError(f"{topic}: pose is out of float32's range")
    return state
