"""ROS messages <-> arrays: encodings, padded rows, joint order, and the messages of every refusal."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mstar_ros.ros.common.convert import (
    ObservationError,
    check_image,
    image_to_array,
    joint_positions,
    labelled_array_msg,
    trajectory_msg,
)


def _image(encoding: str, pixels: np.ndarray, pad: int = 0):
    from sensor_msgs.msg import Image

    h, w = pixels.shape[:2]
    rows = pixels.reshape(h, -1)
    rows = np.concatenate([rows, np.full((h, pad), 7, np.uint8)], axis=1)  # row padding: step > width x channels
    msg = Image(encoding=encoding, height=h, width=w, step=rows.shape[1])
    msg.data = rows.tobytes()
    return msg


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono8"])
def test_images_become_rgb_arrays_with_padding_stripped(encoding):
    rgb = np.random.default_rng(0).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    src = {"rgb8": rgb, "bgr8": rgb[..., ::-1], "mono8": rgb[..., :1]}[encoding]
    msg = _image(encoding, np.ascontiguousarray(src), pad=4)
    check_image(msg, topic="/r/cam", expect_hw=(6, 5))
    out = image_to_array(msg)
    expected = rgb if encoding != "mono8" else np.repeat(rgb[..., :1], 3, axis=2)
    assert out.shape == (6, 5, 3) and out.dtype == np.uint8 and np.array_equal(out, expected)
    assert out.flags.owndata  # a copy: the message buffer is reused


def test_bad_images_are_refused_with_what_is_wrong():
    good = _image("rgb8", np.zeros((4, 4, 3), np.uint8))
    cases = [
        (dict(encoding="rgba8"), "image encoding 'rgba8' is not supported"),
        (dict(width=0), "image is 0x4"),
        (dict(height=5), "image is 4x5, this camera is configured for 4x4"),
        (dict(step=10), "step 10 is less than width x channels = 12 for rgb8"),
        (dict(data=bytes(40)), "40 bytes of data, expected step x height = 48"),
    ]
    for change, says in cases:
        msg = _image("rgb8", np.zeros((4, 4, 3), np.uint8))
        for key, value in change.items():
            setattr(msg, key, value)
        with pytest.raises(ObservationError, match="^/r/cam: " + says.replace("(", r"\(")):
            check_image(msg, topic="/r/cam", expect_hw=(4, 4))
    check_image(good, topic="/r/cam", expect_hw=(4, 4))


def test_joint_states_are_read_in_the_configured_order():
    from sensor_msgs.msg import JointState

    names = ["a", "b", "c"]
    state = joint_positions(JointState(name=["c", "x", "a", "b"], position=[3.0, 9.0, 1.0, 2.0]), names, topic="/j")
    assert state.tolist() == [1.0, 2.0, 3.0] and state.dtype == np.float32
    for msg, says in [
        (JointState(name=["a", "b"], position=[1.0, 2.0]), r"lacks joints \['c'\]"),
        (JointState(name=["a", "b", "c"], position=[1.0]), "3 joint names but 1 positions"),
        (JointState(position=[1.0, 2.0]), "2 positions without names, expected 3"),
        (JointState(name=names, position=[1.0, math.inf, 3.0]), r"NaN or infinite positions for \['b'\]"),
    ]:
        with pytest.raises(ObservationError, match="^/j: .*" + says):
            joint_positions(msg, names, topic="/j")


def test_trajectory_points_are_spaced_at_the_control_rate():
    import torch
    from builtin_interfaces.msg import Time

    msg = trajectory_msg(["a", "b"], torch.zeros(40, 2), 15.0, Time(sec=3))
    t = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
    assert len(t) == 40 and np.allclose(np.diff(t), 1 / 15.0, atol=1e-9) and msg.joint_names == ["a", "b"]


def test_velocities_go_in_the_points_velocities():
    import torch
    from builtin_interfaces.msg import Time

    msg = trajectory_msg(["a", "b"], torch.tensor([[0.5, -0.25], [1.0, 2.0]]), 10.0, Time(sec=3), field="velocities")
    assert [list(p.velocities) for p in msg.points] == [[0.5, -0.25], [1.0, 2.0]]
    assert all(len(p.positions) == 0 for p in msg.points)


def test_a_labelled_array_is_time_by_action_with_the_names_in_its_layout():
    import torch

    actions = torch.arange(21, dtype=torch.float32).reshape(3, 7) / 8
    names = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
    msg = labelled_array_msg(names, actions)
    time, action = msg.layout.dim
    assert (time.label, time.size, time.stride) == ("time", 3, 21)
    assert (action.label.split(","), action.size, action.stride) == (names, 7, 7)
    assert np.array_equal(np.asarray(msg.data, dtype=np.float32).reshape(time.size, action.size), actions.numpy())
    hold = labelled_array_msg(names, None)
    assert hold.layout.dim[0].size == 0 and len(hold.data) == 0 and hold.layout.dim[1].label.split(",") == names
