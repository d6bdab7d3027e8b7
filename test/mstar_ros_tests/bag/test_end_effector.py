"""The synthetic world-model bag and the episodes read back from it, as the rollout benchmark reads them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch
from rosbags.highlevel import AnyReader

from mstar_graphs.vjepa2.pose import next_pose
from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag
from mstar_ros.bag.episodes import read_episodes


def test_the_bag_holds_camera_pose_gripper_and_the_actions_between_poses(tmp_path):
    path = tmp_path / "wm"
    write_end_effector_bag(path, EndEffectorBagSpec(robots=2, seconds=2.0, seed=4, width=48, height=32))
    with AnyReader([path]) as reader:
        topics = sorted(c.topic for c in reader.connections)
        poses, actions, images = [], [], []
        for conn, _t, raw in reader.messages():
            msg = reader.deserialize(raw, conn.msgtype)
            if conn.topic == "/robot1/ee_pose":
                poses.append(msg)
            elif conn.topic == "/robot1/action":
                actions.append(np.asarray(msg.data))
            elif conn.topic == "/robot1/camera/exterior/image_raw":
                images.append(np.asarray(msg.data).reshape(msg.height, msg.width, 3))
    assert topics == sorted(
        f"/robot{r}/{t}"
        for r in (1, 2)
        for t in ("action", "camera/exterior/image_raw", "ee_pose", "gripper/joint_states")
    )
    assert len(poses) == len(actions) == len(images) == 30
    q = poses[0].pose.orientation
    assert abs(q.x**2 + q.y**2 + q.z**2 + q.w**2 - 1) < 1e-9
    assert any(not np.array_equal(a, b) for a, b in zip(images, images[1:]))  # the scene follows the arm
    episode = read_episodes(path, fps=15.0, namespaces=["/robot1"])[0]
    # the recorded action takes each pose to the next, as Meta's compute_new_pose applies it
    for t in range(len(episode.states) - 1):
        moved = next_pose(episode.states[t].double(), torch.from_numpy(actions[t]))
        assert torch.allclose(moved[:6], episode.states[t + 1][:6].double(), atol=1e-5)


def test_episodes_at_4_fps_and_the_cli(tmp_path):
    out = tmp_path / "cli_wm"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "bag",
            "make-world-model",
            str(out),
            "--robots",
            "2",
            "--seconds",
            "3",
            "--size",
            "40x40",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "2 robot(s), 45 frames each" in run.stdout
    episodes = read_episodes(out)
    assert [e.namespace for e in episodes] == ["/robot1", "/robot2"]
    for e in episodes:
        assert e.frames.shape == (12, 40, 40, 3) and e.frames.dtype == torch.uint8
        gaps = np.diff(e.stamps_ns) / 1e9
        # the frame nearest each 0.25 s tick of a 15 Hz camera: within one camera period, 0.25 s on average
        assert np.all(np.abs(gaps - 0.25) <= 1 / 15 + 1e-3) and abs(gaps.mean() - 0.25) < 0.01, gaps
        assert e.actions.shape == (11, 7) and torch.isfinite(e.actions).all()
