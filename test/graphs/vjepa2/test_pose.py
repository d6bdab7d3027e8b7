"""Poses and the actions between them as Meta's code computes them (scipy's extrinsic xyz Euler angles)."""

from __future__ import annotations

import math

import pytest
import torch

from mstar_graphs.vjepa2.pose import (
    euler_to_matrix,
    euler_to_quaternion,
    matrix_to_euler,
    next_pose,
    pose_delta,
    quaternion_to_euler,
)


def _rot(axis: str, a: float) -> torch.Tensor:
    c, s = math.cos(a), math.sin(a)
    return {
        "x": torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]]),
        "y": torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]]),
        "z": torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]]),
    }[axis].double()


def test_extrinsic_xyz_is_rz_ry_rx():
    roll, pitch, yaw = 0.3, -0.4, 2.5
    want = _rot("z", yaw) @ _rot("y", pitch) @ _rot("x", roll)
    assert torch.allclose(euler_to_matrix(torch.tensor([roll, pitch, yaw])), want)
    assert torch.allclose(matrix_to_euler(want), torch.tensor([roll, pitch, yaw]).double())


def test_next_pose_composes_on_the_left_wraps_and_clips_the_gripper():
    pose = torch.tensor([0.58, -0.002, 0.248, -3.067, 0.031, -1.913, 0.997])  # Meta's example state
    action = torch.tensor([0.01, 0.0, -0.02, -0.2, 0.0, 0.0, 0.05])
    out = next_pose(pose, action)
    assert torch.allclose(out[:3], pose[:3] + action[:3])
    want = euler_to_matrix(action[3:6]) @ euler_to_matrix(pose[3:6])
    assert torch.allclose(euler_to_matrix(out[3:6]), want, atol=1e-6)
    assert float(out[6]) == 1.0
    flat = next_pose(torch.tensor([0, 0, 0, -3.067, 0, 0, 0.5]), torch.tensor([0, 0, 0, -0.2, 0, 0, 0]))
    assert float(flat[3]) == pytest.approx(-3.267 + 2 * math.pi, abs=1e-6)  # wrapped into [-pi, pi]


def test_pose_delta_is_the_action_between_poses():
    g = torch.Generator().manual_seed(0)
    start = torch.cat([torch.rand(3, generator=g), (torch.rand(3, generator=g) - 0.5) * 2, torch.tensor([0.3])])
    end = torch.cat([torch.rand(3, generator=g), (torch.rand(3, generator=g) - 0.5) * 2, torch.tensor([0.6])])
    delta = pose_delta(start, end)
    assert torch.allclose(next_pose(start, delta), end, atol=1e-5)


def test_quaternions_round_trip():
    angles = torch.tensor([[0.1, -0.2, 0.3], [-3.0, 0.5, 1.5]]).double()
    assert torch.allclose(quaternion_to_euler(euler_to_quaternion(angles)), angles)
