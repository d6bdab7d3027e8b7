"""Which camera frames extend a world model's session, and the state that goes with each.

V-JEPA 2-AC was trained on frames 1 / fps apart (DROID at 4 fps); a camera publishes faster
(15 Hz). A frame is taken when its ``header.stamp`` is at least one period (less a little
jitter slack) after the last one taken. Its state is the newest end-effector pose (x, y, z,
extrinsic xyz angles from the quaternion) and gripper position scaled to [0, 1]; when either is
more than ``max_pose_age_s`` from the frame's stamp the frame is not used, and a pose that is
not finite or not a unit quaternion is dropped when it arrives.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mstar_graphs.vjepa2.pose import quaternion_to_euler

JITTER_SLACK = 0.1  # a frame up to 10% of a period early still counts as the next one


class StateError(ValueError):
    pass


@dataclass
class FramePicker:
    fps: float
    last_stamp: float | None = None

    def due(self, stamp: float) -> bool:
        """Whether the frame stamped ``stamp`` (s) is the session's next one (and marks it taken)."""
        period = 1.0 / self.fps
        if self.last_stamp is not None and stamp < self.last_stamp + period * (1 - JITTER_SLACK):
            return False
        self.last_stamp = stamp
        return True

    def reset(self) -> None:
        self.last_stamp = None


def pose_state(position: tuple[float, float, float], orientation: tuple[float, float, float, float],
               gripper: float, *, topic: str) -> torch.Tensor:
    """[x, y, z, roll, pitch, yaw, gripper]: orientation as geometry_msgs orders it (x, y, z, w)."""
    values = [*position, *orientation, gripper]
    if not all(math.isfinite(v) for v in values):
        raise StateError(f"{topic}: pose or gripper has NaN or infinite values")
    norm = math.sqrt(sum(q * q for q in orientation))
    if not 0.5 < norm < 1.5:
        raise StateError(f"{topic}: orientation is not a unit quaternion (norm {norm:.3g})")
    euler = quaternion_to_euler(torch.tensor(orientation, dtype=torch.float64))
    return torch.tensor([*position, *euler.tolist(), min(max(gripper, 0.0), 1.0)], dtype=torch.float32)
