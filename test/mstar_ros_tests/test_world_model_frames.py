"""Frames picked at the model's rate by their stamps; poses turned into states; plans into poses."""
from __future__ import annotations

import math

import pytest
import torch

from mstar_graphs.vjepa2.pose import euler_to_quaternion, next_pose
from mstar_ros.world_model.frames import FramePicker, StateError, pose_state
from mstar_ros.world_model.plan_targets import plan_poses, pose_parts


def test_frames_are_taken_one_period_apart_by_stamp_with_jitter_slack():
    picker = FramePicker(fps=4.0)
    stamps = [0.0, 0.066, 0.133, 0.2, 0.235, 0.27, 0.5, 0.51, 0.74]
    taken = [t for t in stamps if picker.due(t)]
    assert taken == [0.0, 0.235, 0.5, 0.74]  # 0.235 is 6% early: still the next frame


def test_pose_state_reads_the_quaternion_and_scales_the_gripper():
    angles = torch.tensor([math.pi - 0.1, 0.2, -0.3]).double()
    q = euler_to_quaternion(angles).tolist()
    state = pose_state((0.5, 0.0, 0.3), tuple(q), 1.4, topic="ee_pose")
    assert torch.allclose(state[3:6].double(), angles, atol=1e-6) and float(state[6]) == 1.0
    with pytest.raises(StateError, match="NaN"):
        pose_state((float("nan"), 0.0, 0.0), (0.0, 0.0, 0.0, 1.0), 0.0, topic="ee_pose")
    with pytest.raises(StateError, match="unit quaternion"):
        pose_state((0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), 0.0, topic="ee_pose")


def test_plan_poses_follow_the_actions_as_metas_compute_new_pose():
    state = torch.tensor([0.5, 0.0, 0.3, 3.1, 0.0, 0.0, 0.2])
    plan = torch.tensor([[0.01, 0.0, 0.02, 0.0, 0.0, 0.0, 0.5], [0.0, -0.01, 0.0, 0.0, 0.0, 0.0, 0.6]])
    poses = plan_poses(state, plan)
    assert torch.allclose(poses[0], next_pose(state, plan[0])) and torch.allclose(poses[1], next_pose(poses[0], plan[1]))
    assert float(poses[1][6]) == 1.0  # the gripper clipped to [0, 1]
    (x, _y, z), quat, grip = pose_parts(poses[0])
    assert (x, z) == pytest.approx((0.51, 0.32)) and grip == pytest.approx(0.7)
    assert sum(v * v for v in quat) == pytest.approx(1.0)
