"""A robot's joints and actions checked against real checkpoints' state and action dims (no ROS needed)."""

from __future__ import annotations

import msgspec
import pytest

from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05
from mstar_graphs.pi05.frontend import Pi05Policy
from mstar_ros.ros.pi05.params import PARAMETERS, PolicyParams
from mstar_ros.ros.pi05.params_fit import check_fits
from support.pi05_layouts import lerobot_checkpoint, openpi_checkpoint

JOINTS = [f"j{i}" for i in range(8)]
EE = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
STATS = {"q01": [-1.0] * 8, "q99": [1.0] * 8, "mean": [0.0] * 8, "std": [1.0] * 8}


def params(**given) -> PolicyParams:
    values = {name: default for name, (default, _) in PARAMETERS.items()}
    values.update(cameras={"base_0_rgb": "cam"}, joint_lower=[], joint_upper=[], action_names=[], joint_names=JOINTS)
    return msgspec.convert({**values, **given}, PolicyParams)


@pytest.fixture(scope="module")
def libero(tmp_path_factory):
    """A LeRobot checkpoint with an 8-d state and 7-d actions."""
    out = lerobot_checkpoint(
        tmp_path_factory.mktemp("ck") / "libero",
        ensure_tiny_pi05(),
        {"observation.state": STATS, "action": {k: v[:7] for k, v in STATS.items()}},
        state_dim=8,
        action_dim=7,
    )
    return Pi05Policy.load(out, load_weights=False, progress=False)


@pytest.fixture(scope="module")
def without_statistics(tmp_path_factory):
    out = openpi_checkpoint(tmp_path_factory.mktemp("ck") / "openpi", ensure_tiny_pi05(), None)
    return Pi05Policy.load(out, load_weights=False, progress=False)


def test_actions_other_than_the_joints_fit_a_checkpoint_whose_actions_differ_from_its_state(libero):
    check_fits(params(action_names=EE, action_space="labelled_array"), libero, "/r")
    with pytest.raises(
        ValueError,
        match=r"^/r: parameter joint_names: 8 joints, but the checkpoint's actions have 7 "
        r"dims \(.*\) \(set action_names for actions that are not the state's joints",
    ):
        check_fits(params(), libero, "/r")  # today's default: the actions are the joints
    with pytest.raises(ValueError, match="parameter action_names: 6 names, but the checkpoint's actions have 7 dims"):
        check_fits(params(action_names=EE[:6], action_space="labelled_array"), libero, "/r")
    with pytest.raises(ValueError, match="parameter joint_names: 7 joints, but the checkpoint's state has 8 dims"):
        check_fits(params(joint_names=JOINTS[:7], action_names=EE), libero, "/r")


def test_without_statistics_only_the_joints_positions_can_be_scaled_by_their_limits(without_statistics):
    check_fits(params(), without_statistics, "/r")  # the joints give the dims; their limits scale both
    check_fits(params(action_names=list(JOINTS)), without_statistics, "/r")  # the joints, named explicitly
    with pytest.raises(ValueError, match="parameter action_space: the checkpoint has no normalisation statistics"):
        check_fits(params(action_space="joint_velocities"), without_statistics, "/r")
    with pytest.raises(ValueError, match="parameter action_names: the checkpoint has no normalisation statistics"):
        check_fits(params(action_names=EE), without_statistics, "/r")
    with pytest.raises(ValueError, match="parameter joint_names: 33 joints, but the model acts in 32 dims"):
        check_fits(params(joint_names=[f"j{i}" for i in range(33)]), without_statistics, "/r")
