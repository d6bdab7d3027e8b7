"""Released checkpoint layouts served over real DDS: the published actions for a raw joint state are the
reference's (normalise with the checkpoint's state statistics -> pi0.5 -> unnormalise with its action
statistics), computed here with the dense reference model and the formulas written out in numpy."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import yaml

from mstar_ros.launch_spec import default_params_file, pi05_processes
from support.pi05_layouts import lerobot_checkpoint, openpi_checkpoint

JOINTS = [f"panda_joint{i}" for i in range(1, 8)] + ["robotiq_85_left_knuckle_joint"]
CAMERAS = ["camera/exterior/image_raw", "camera/wrist/image_raw"]
RAW_STATE = np.array([0.3, -0.4, 0.1, -1.9, 0.2, 1.6, 0.7, 0.04], dtype=np.float32)
# state and action statistics that differ in every dim: mixing them up changes every action
STATE = {
    "q01": [-1.5, -1.2, -2.0, -2.9, -1.0, 0.2, -1.4, 0.0],
    "q99": [1.4, 1.1, 2.2, -0.5, 1.3, 3.1, 2.0, 0.08],
    "mean": [0.0] * 8,
    "std": [1.0] * 8,
}
ACTION = {
    "q01": [-0.6, -0.2, -0.9, -2.5, -0.3, 0.5, -0.1, -0.01],
    "q99": [0.9, 0.4, 1.3, -1.1, 0.8, 2.4, 1.2, 0.09],
    "mean": [0.0] * 8,
    "std": [1.0] * 8,
}


def _reference_actions(ckpt, state_n: np.ndarray, pixels: bytes, seed: int, dims: int = 8) -> torch.Tensor:
    """The dense reference (prefix and actions recomputed jointly every Euler step) on the same inputs."""
    from mstar.graph.node import NodeCall
    from mstar_graphs.pi05.pi05 import Pi05Model
    from mstar_graphs.pi05.prompt import build_prefix
    from mstar_graphs.pi05.reference import sample_actions
    from mstar_graphs.pi05.siglip import Pi05ImageEncoder
    from mstar_graphs.pi05.tokenizer import load_tokenizer

    model = Pi05Model.from_pretrained_dir(ckpt, progress=False)
    encoder = Pi05ImageEncoder.from_pretrained_dir(ckpt, progress=False)
    image = torch.from_numpy(np.frombuffer(pixels, dtype=np.uint8).reshape(224, 224, 3).copy())
    images = torch.stack([image, image])
    with torch.no_grad():
        embeds = encoder(**encoder.prepare_inputs([NodeCall("r", {"images": images})]))["embeds"][0]
    ids, mask = build_prefix(
        load_tokenizer(ckpt / "tokenizer.json"), 2, "pick up the object", torch.from_numpy(state_n)
    )
    noise = torch.randn((50, 32), generator=torch.Generator().manual_seed(seed))  # the node's first request
    return sample_actions(model, ids, noise, embeds=embeds, embed_mask=mask)[:, :dims].double()


def _lerobot(x: np.ndarray, s: dict) -> np.ndarray:  # NormalizerProcessorStep, QUANTILES, float32
    q01, q99 = np.float32(s["q01"]), np.float32(s["q99"])
    return 2 * (x - q01) / (q99 - q01) - 1


def _lerobot_back(a: np.ndarray, s: dict) -> np.ndarray:  # UnnormalizerProcessorStep, QUANTILES
    q01, q99 = np.float32(s["q01"]), np.float32(s["q99"])
    return (a + 1) * (q99 - q01) / 2 + q01


def _openpi(x: np.ndarray, s: dict) -> np.ndarray:  # transforms.Normalize, quantiles
    q01, q99 = np.array(s["q01"]), np.array(s["q99"])
    return ((x - q01) / (q99 - q01 + 1e-6) * 2.0 - 1.0).astype(np.float32)


def _openpi_back(a: np.ndarray, s: dict) -> np.ndarray:  # transforms.Unnormalize, quantiles
    q01, q99 = np.array(s["q01"]), np.array(s["q99"])
    return (a + 1.0) / 2.0 * (q99 - q01 + 1e-6) + q01


LIMITS = yaml.safe_load(default_params_file().read_text())["/**"]["ros__parameters"]
LOWER, UPPER = np.float32(LIMITS["joint_lower"]), np.float32(LIMITS["joint_upper"])


def _limits(x: np.ndarray, _s: dict) -> np.ndarray:  # ours, for a checkpoint without statistics
    return 2 * (x - LOWER) / (UPPER - LOWER) - 1


def _limits_back(a: np.ndarray, _s: dict) -> np.ndarray:
    return (a + 1) / 2 * (UPPER - LOWER) + LOWER


@pytest.mark.timeout(150)
@pytest.mark.parametrize("layout", ["lerobot", "openpi", "openpi-without-assets"])
def test_published_actions_are_the_references_for_a_raw_state(layout, procs, ros_client, robot_feed, tmp_path):
    from trajectory_msgs.msg import JointTrajectory

    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    ckpt = ensure_tiny_pi05()  # the generated weights, re-laid in each released layout

    if layout == "lerobot":
        weights = lerobot_checkpoint(
            tmp_path / "ck",
            ckpt,
            {"observation.state": STATE, "action": ACTION},
            cameras=("base_0_rgb", "left_wrist_0_rgb"),
        )
        norm, back, extra = _lerobot, _lerobot_back, []
    elif layout == "openpi":  # its three cameras; this robot has no right wrist one: left out, as openpi masks it
        weights = openpi_checkpoint(tmp_path / "ck", ckpt, {"state": STATE, "actions": ACTION})
        norm, back, extra = _openpi, _openpi_back, ["-p", "cameras.right_wrist_0_rgb:=''"]
    else:  # no norm_stats.json (openpi's converter often leaves it): the robot's joint limits, both ways
        weights = openpi_checkpoint(tmp_path / "ck", ckpt, None)
        norm, back, extra = _limits, _limits_back, ["-p", "cameras.right_wrist_0_rgb:=''"]
    ros_client.subscribe(JointTrajectory, "/robot1/action_chunk")
    (spec,) = pi05_processes(
        "/robot1",
        weights=str(weights),
        dtype="float32",  # parity: float32
        extra_arguments=["--duration", "120"],
        ros_arguments=extra,
    )
    node_set = procs(*spec.command(python=sys.executable))
    feed = robot_feed("/robot1", CAMERAS, JOINTS, positions=RAW_STATE.tolist()).start()
    ros_client.wait_for(
        lambda: any(g.msg.points for g in ros_client.got("/robot1/action_chunk")), 90, "the first chunk", [node_set]
    )
    first = next(g.msg for g in ros_client.got("/robot1/action_chunk") if g.msg.points)
    published = np.array([list(p.positions) for p in first.points])
    skip = 50 - len(published)  # the actions whose time passed while the chunk was computed
    actions = _reference_actions(weights, norm(RAW_STATE, STATE), feed.pixels, seed=1).numpy()
    want = back(actions, ACTION)[skip:]
    scale = np.abs(want).max()
    assert np.abs(published - want).max() < 1e-4 * scale, np.abs(published - want).max()
    if layout != "openpi-without-assets":  # (joint limits scale both ways alike)
        mixed = back(actions, STATE)[skip:]  # unnormalised with the state's statistics instead
        assert np.abs(published - mixed).max() > 100 * np.abs(published - want).max() + 1e-3
    assert node_set.interrupt() == 0, node_set.output
    said = "JOINT_LIMITS (state and actions) from joint limits" if layout.endswith("assets") else "QUANTILES"
    assert f"normalisation: {said}" in node_set.output
    assert "dtype float32 (set explicitly)" in node_set.output  # the launch argument reached the engines


# LIBERO-style: the 8-d state is the joints, the actions 7 end-effector deltas and the gripper
EE_NAMES = ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
EE_ACTION = {k: v[:7] for k, v in ACTION.items()}


@pytest.mark.timeout(150)
def test_actions_that_are_not_the_states_joints_go_out_as_a_labelled_array(procs, ros_client, robot_feed, tmp_path):
    from std_msgs.msg import Float32MultiArray

    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    weights = lerobot_checkpoint(
        tmp_path / "ck",
        ensure_tiny_pi05(),
        {"observation.state": STATE, "action": EE_ACTION},
        cameras=("base_0_rgb", "left_wrist_0_rgb"),
        state_dim=8,
        action_dim=7,
    )
    ros_client.subscribe(Float32MultiArray, "/robot1/action_chunk")
    (spec,) = pi05_processes(
        "/robot1",
        weights=str(weights),
        dtype="float32",
        extra_arguments=["--duration", "120"],
        ros_arguments=["-p", "action_space:=labelled_array", "-p", f"action_names:={EE_NAMES}"],
    )
    node_set = procs(*spec.command(python=sys.executable))
    feed = robot_feed("/robot1", CAMERAS, JOINTS, positions=RAW_STATE.tolist()).start()
    ros_client.wait_for(
        lambda: any(g.msg.data for g in ros_client.got("/robot1/action_chunk")),
        90,
        "the first labelled array",
        [node_set],
    )
    first = next(g.msg for g in ros_client.got("/robot1/action_chunk") if g.msg.data)
    time_dim, action_dim = first.layout.dim
    assert time_dim.label == "time" and action_dim.label.split(",") == EE_NAMES and action_dim.size == 7
    published = np.asarray(first.data, dtype=np.float64).reshape(time_dim.size, 7)
    skip = 50 - time_dim.size  # the actions whose time passed while the chunk was computed
    actions = _reference_actions(weights, _lerobot(RAW_STATE, STATE), feed.pixels, seed=1, dims=7).numpy()
    want = _lerobot_back(actions, EE_ACTION)[skip:]
    assert np.abs(published - want).max() < 1e-4 * np.abs(want).max(), np.abs(published - want).max()
    assert node_set.interrupt() == 0, node_set.output
    assert "actions: labelled_array x, y, z, roll, pitch, yaw, gripper (std_msgs/Float32MultiArray)" in node_set.output
