"""ROS messages <-> tensors, with the checks a robot's data deserves.

Every problem raises ObservationError with a message that says what is wrong with
which message; the caller reports it on /diagnostics and drops the frame.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1}


class ObservationError(ValueError):
    pass


def image_to_tensor(msg, *, topic: str, expect_hw: tuple[int, int] | None = None) -> torch.Tensor:
    """sensor_msgs/Image (rgb8, bgr8, mono8) -> uint8 [H, W, 3] RGB."""
    enc = msg.encoding
    if enc not in CHANNELS:
        raise ObservationError(f"{topic}: image encoding {enc!r} is not supported (use one of {sorted(CHANNELS)})")
    h, w, c = int(msg.height), int(msg.width), CHANNELS[enc]
    if h <= 0 or w <= 0:
        raise ObservationError(f"{topic}: image is {w}x{h}")
    if expect_hw is not None and (h, w) != tuple(expect_hw):
        raise ObservationError(f"{topic}: image is {w}x{h}, this camera is configured for {expect_hw[1]}x{expect_hw[0]}")
    if int(msg.step) < w * c:
        raise ObservationError(f"{topic}: step {msg.step} is less than width x channels = {w * c} for {enc}")
    data = msg.data
    buf = np.frombuffer(bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data, dtype=np.uint8)
    if buf.size != int(msg.step) * h:
        raise ObservationError(f"{topic}: {buf.size} bytes of data, expected step x height = {int(msg.step) * h}")
    rows = buf.reshape(h, int(msg.step))[:, : w * c].reshape(h, w, c)
    if enc == "bgr8":
        rows = rows[..., ::-1]
    elif enc == "mono8":
        rows = np.repeat(rows, 3, axis=2)
    return torch.from_numpy(rows.copy())  # owns its bytes: the message buffer is read-only and reused


def joint_state_to_tensor(msg, joint_names: Sequence[str], *, topic: str) -> torch.Tensor:
    """sensor_msgs/JointState -> positions [len(joint_names)] in the configured order."""
    names, positions = list(msg.name), list(msg.position)
    if len(positions) != len(names) and names:
        raise ObservationError(f"{topic}: {len(names)} joint names but {len(positions)} positions")
    if names:
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in joint_names if n not in index]
        if missing:
            raise ObservationError(f"{topic}: joint state lacks joints {missing} (it has {names})")
        values = [positions[index[n]] for n in joint_names]
    else:
        if len(positions) != len(joint_names):
            raise ObservationError(f"{topic}: {len(positions)} positions without names, expected {len(joint_names)}")
        values = positions
    state = torch.tensor(values, dtype=torch.float32)
    if not torch.isfinite(state).all():
        bad = [n for n, v in zip(joint_names, values) if not np.isfinite(v)]
        raise ObservationError(f"{topic}: joint state has NaN or infinite positions for {bad}")
    return state


def normalize_state(state: torch.Tensor, low: Sequence[float], high: Sequence[float]) -> torch.Tensor:
    """Joint positions -> [-1, 1] by the configured joint limits (what pi0.5 discretises)."""
    lo, hi = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
    return ((state - lo) / (hi - lo) * 2 - 1).clamp(-1, 1)


def denormalize_actions(actions: torch.Tensor, low: Sequence[float], high: Sequence[float]) -> torch.Tensor:
    """The first len(low) action dims, from [-1, 1] to joint units."""
    lo, hi = torch.tensor(low, dtype=torch.float32), torch.tensor(high, dtype=torch.float32)
    return (actions[:, : len(low)].clamp(-1, 1) + 1) / 2 * (hi - lo) + lo


def trajectory_msg(joint_names: Sequence[str], positions: torch.Tensor, rate_hz: float, start_stamp,
                   frame_id: str = ""):
    """trajectory_msgs/JointTrajectory: one point per action, ``time_from_start`` = i / rate."""
    from builtin_interfaces.msg import Duration
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    msg = JointTrajectory()
    msg.header.stamp = start_stamp
    msg.header.frame_id = frame_id
    msg.joint_names = list(joint_names)
    points = []
    for i, row in enumerate(positions.tolist()):
        t = i / rate_hz
        point = JointTrajectoryPoint()
        point.positions = row
        point.time_from_start = Duration(sec=int(t), nanosec=int(round((t - int(t)) * 1e9)))
        points.append(point)
    msg.points = points
    return msg
