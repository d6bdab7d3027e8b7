"""Frames picked at the model's rate by their stamps; poses turned into states; plans into poses."""

from __future__ import annotations

import math

import pytest
import torch

from mstar_graphs.vjepa2.pose import euler_to_quaternion, next_pose
from mstar_ros.world_model.frames import FramePicker, StateError, check_pose, gripper_state, pose_state
from mstar_ros.world_model.plan_targets import plan_poses, pose_parts


def test_frames_are_taken_one_period_apart_by_stamp_with_jitter_slack():
    picker = FramePicker(fps=4.0)
    stamps = [0.0, 0.066, 0.133, 0.2, 0.235, 0.27, 0.5, 0.51, 0.74]
    taken = [t for t in stamps if picker.due(t)]
    assert taken == [0.0, 0.235, 0.5, 0.74]  # 0.235 is 6% early: still the next frame


def test_frames_start_over_when_the_stamps_went_back_further_than_max_back():
    """A clock that went back (a bag looped under sim time) must not hold the frames until it catches up."""
    picker = FramePicker(fps=4.0, max_back_s=1.0)
    assert picker.due(100.0) and not picker.due(100.1)
    assert not picker.due(99.5)  # out of order by less than max_back_s: not the next frame
    assert picker.due(10.0) and picker.last_stamp == 10.0
    assert not picker.due(10.1) and picker.due(10.25)


def test_a_pose_must_be_finite_and_within_max_position_m():
    check_pose((0.5, -0.2, 0.3), (0.0, 0.0, 0.0, 1.0), topic="/r/ee_pose", max_position_m=10.0)
    with pytest.raises(StateError, match=r"/r/ee_pose: position x 1e\+300 is over max_position_m=10"):
        check_pose((1e300, 0.0, 0.0), (0.0, 0.0, 0.0, 1.0), topic="/r/ee_pose", max_position_m=10.0)
    with pytest.raises(StateError, match="position z -inf is not finite"):
        check_pose((0.0, 0.0, float("-inf")), (0.0, 0.0, 0.0, 1.0), topic="/r/ee_pose", max_position_m=10.0)
    with pytest.raises(StateError, match="orientation has NaN or infinite values"):
        check_pose((0.0, 0.0, 0.0), (0.0, float("nan"), 0.0, 1.0), topic="/r/ee_pose", max_position_m=10.0)
    with pytest.raises(StateError, match="not a unit quaternion"):
        check_pose((0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 3.0), topic="/r/ee_pose", max_position_m=10.0)


def test_a_gripper_reading_must_be_finite_and_near_its_range():
    assert gripper_state(0.085, 0.085, topic="/r/gripper") == pytest.approx(1.0)
    assert gripper_state(0.09, 0.085, topic="/r/gripper") == 1.0  # a little past closed: clipped
    assert gripper_state(-0.001, 0.085, topic="/r/gripper") == 0.0
    with pytest.raises(StateError, match="/r/gripper: gripper position nan is not finite"):
        gripper_state(float("nan"), 1.0, topic="/r/gripper")
    with pytest.raises(StateError, match=r"gripper position 3 is outside \[-0.5, 1.5\] x gripper_max=1"):
        gripper_state(3.0, 1.0, topic="/r/gripper")


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
    assert torch.allclose(poses[0], next_pose(state, plan[0])) and torch.allclose(
        poses[1], next_pose(poses[0], plan[1])
    )
    assert float(poses[1][6]) == 1.0  # the gripper clipped to [0, 1]
    (x, _y, z), quat, grip = pose_parts(poses[0])
    assert (x, z) == pytest.approx((0.51, 0.32)) and grip == pytest.approx(0.7)
    assert sum(v * v for v in quat) == pytest.approx(1.0)
