"""ROS messages <-> tensors, with the checks a robot's data deserves.

Every problem raises ObservationError with a message that says what is wrong with
which message; the caller reports it on /diagnostics and drops the frame.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

import numpy as np
import torch

CHANNELS = {"rgb8": 3, "bgr8": 3, "mono8": 1}


class ObservationError(ValueError):
    pass


def check_image(msg, *, topic: str, expect_hw: tuple[int, int] | None = None) -> None:
    """Raises ObservationError unless ``msg`` is an image we can read: cheap (no pixel is touched),
    so it runs on every message; the pixels are converted only for the frames a request uses."""
    enc = msg.encoding
    if enc not in CHANNELS:
        raise ObservationError(f"{topic}: image encoding {enc!r} is not supported (use one of {sorted(CHANNELS)})")
    h, w, c = int(msg.height), int(msg.width), CHANNELS[enc]
    if h <= 0 or w <= 0:
        raise ObservationError(f"{topic}: image is {w}x{h}")
    if expect_hw is not None and (h, w) != tuple(expect_hw):
        raise ObservationError(
            f"{topic}: image is {w}x{h}, this camera is configured for {expect_hw[1]}x{expect_hw[0]}"
        )
    if int(msg.step) < w * c:
        raise ObservationError(f"{topic}: step {msg.step} is less than width x channels = {w * c} for {enc}")
    if len(msg.data) != int(msg.step) * h:
        raise ObservationError(f"{topic}: {len(msg.data)} bytes of data, expected step x height = {int(msg.step) * h}")


def image_to_array(msg) -> np.ndarray:
    """A checked sensor_msgs/Image (rgb8, bgr8, mono8) -> uint8 [H, W, 3] RGB numpy array (a copy).

    numpy, not torch: this runs on ROS threads, and torch ops there would compete with the
    device thread's OpenMP team (see mstar.engine.device_loop)."""
    h, w, c, step = int(msg.height), int(msg.width), CHANNELS[msg.encoding], int(msg.step)
    buf = np.frombuffer(memoryview(msg.data).cast("B"), dtype=np.uint8)  # array.array, bytes or numpy: no copy
    rows = buf.reshape(h, step)[:, : w * c].reshape(h, w, c)
    if msg.encoding == "bgr8":
        rows = rows[..., ::-1]
    elif msg.encoding == "mono8":
        rows = np.repeat(rows, 3, axis=2)
    return rows.copy()  # owns its bytes: the message's buffer is reused


def image_to_tensor(msg, *, topic: str, expect_hw: tuple[int, int] | None = None) -> torch.Tensor:
    """sensor_msgs/Image (rgb8, bgr8, mono8) -> uint8 [H, W, 3] RGB."""
    check_image(msg, topic=topic, expect_hw=expect_hw)
    return torch.from_numpy(image_to_array(msg))


def joint_positions(msg, joint_names: Sequence[str], *, topic: str) -> np.ndarray:
    """sensor_msgs/JointState -> float32 positions [len(joint_names)] in the configured order."""
    names, positions = list(msg.name), list(msg.position)
    if len(positions) != len(names) and names:
        raise ObservationError(f"{topic}: {len(names)} joint names but {len(positions)} positions")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ObservationError(f"{topic}: joint state names {dupes} more than once")
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
    state = np.asarray(values, dtype=np.float32)
    if not np.isfinite(state).all():
        bad = [n for n, v in zip(joint_names, state) if not np.isfinite(v)]
        raise ObservationError(f"{topic}: joint state has NaN or infinite positions for {bad}")
    return state


def joint_state_to_tensor(msg, joint_names: Sequence[str], *, topic: str) -> torch.Tensor:
    """sensor_msgs/JointState -> positions [len(joint_names)] in the configured order."""
    return torch.from_numpy(joint_positions(msg, joint_names, topic=topic))


def stamp_seconds(msg) -> float:
    """``header.stamp`` in seconds (0.0: the publisher left it unset)."""
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def outside_limits(
    names: Sequence[str], values: np.ndarray, lower: Sequence[float], upper: Sequence[float]
) -> list[str]:
    """'name [min, max] outside [lower, upper]' for each joint whose values [..., len(names)] leave its limits."""
    if not lower:
        return []
    rows = np.asarray(values, dtype=np.float64).reshape(-1, len(names))
    low, high = rows.min(axis=0), rows.max(axis=0)
    return [
        f"{n} [{a:.3g}, {b:.3g}] outside [{lo:.3g}, {hi:.3g}]"
        if a != b
        else f"{n} {a:.3g} outside [{lo:.3g}, {hi:.3g}]"
        for n, a, b, lo, hi in zip(names, low, high, lower, upper)
        if a < lo or b > hi
    ]


def trajectory_msg(
    joint_names: Sequence[str],
    positions: torch.Tensor | None,
    rate_hz: float,
    start_stamp,
    frame_id: str = "",
    *,
    field: str = "positions",
):
    """trajectory_msgs/JointTrajectory: one point per action, ``time_from_start`` = i / rate, the
    values in each point's ``field`` (positions, or velocities). With no ``positions``, the empty
    trajectory that JointTrajectoryController takes as "stop and hold"."""
    from builtin_interfaces.msg import Duration
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    msg = JointTrajectory()
    msg.header.stamp = start_stamp
    msg.header.frame_id = frame_id
    msg.joint_names = list(joint_names)
    points = []
    for i, row in enumerate([] if positions is None else positions.tolist()):
        t = i / rate_hz
        point = JointTrajectoryPoint()
        setattr(point, field, row)
        point.time_from_start = Duration(sec=int(t), nanosec=int(round((t - int(t)) * 1e9)))
        points.append(point)
    msg.points = points
    return msg


def labelled_array_msg(names: Sequence[str], actions: torch.Tensor | None):
    """std_msgs/Float32MultiArray [time, action] (row-major): ``layout.dim[0]`` "time" (one row per
    action), ``layout.dim[1]`` labelled with the action names joined by commas. With no ``actions``,
    zero rows: the hold."""
    from std_msgs.msg import Float32MultiArray, MultiArrayDimension

    rows = np.zeros((0, len(names)), dtype=np.float32) if actions is None else actions.float().numpy()
    msg = Float32MultiArray()
    msg.layout.dim = [
        MultiArrayDimension(label="time", size=rows.shape[0], stride=rows.size),
        MultiArrayDimension(label=",".join(names), size=len(names), stride=len(names)),
    ]
    data = array.array("f")
    data.frombytes(np.ascontiguousarray(rows, dtype=np.float32).tobytes())  # rclpy takes an array('f') as it is
    msg.data = data
    return msg
