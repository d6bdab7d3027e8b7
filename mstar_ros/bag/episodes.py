"""World-model episodes read straight from a rosbag2 (no ROS install): frames, poses, actions.

Per robot namespace, at ``fps`` (V-JEPA 2-AC trained at 4 fps on DROID): the camera frame
nearest each tick, the end-effector pose (PoseStamped -> x, y, z and extrinsic xyz angles) and
gripper position at that frame's stamp, and the action between consecutive frames as Meta's code
computes it from the poses (recorded ``action`` topics are not needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mstar_ros.bag.end_effector import world_model_topics
from mstar_ros.bag.open_bag import bag_messages, open_bag


@dataclass
class Episode:
    namespace: str
    frames: torch.Tensor  # [T, H, W, 3] uint8
    states: torch.Tensor  # [T, 7]
    actions: torch.Tensor  # [T - 1, 7]: actions[t] takes states[t] to states[t + 1]
    stamps_ns: list[int]


def _image(msg) -> np.ndarray:
    if msg.encoding not in ("rgb8", "bgr8"):
        raise ValueError(f"camera frames must be rgb8 or bgr8, got {msg.encoding!r}")
    data = np.asarray(msg.data, dtype=np.uint8).reshape(msg.height, msg.step)[:, : msg.width * 3]
    img = data.reshape(msg.height, msg.width, 3)
    return img[..., ::-1].copy() if msg.encoding == "bgr8" else img.copy()


def read_episodes(bag: str | Path, fps: float = 4.0, namespaces: list[str] | None = None) -> list[Episode]:
    """One episode per robot namespace found (or named)."""
    from rosbags.highlevel import AnyReader

    from mstar_graphs.vjepa2.pose import pose_delta, quaternion_to_euler

    bag = Path(bag)
    streams: dict[str, dict[str, list]] = {}
    with open_bag(bag):
        pass  # a broken bag is one BagError naming the file, before AnyReader's own errors
    with AnyReader([bag]) as reader:
        topics = {c.topic for c in reader.connections}
        found = namespaces or sorted({t.rsplit("/ee_pose", 1)[0] for t in topics if t.endswith("/ee_pose")})
        if not found:
            raise ValueError(f"{bag}: no NS/ee_pose topic (geometry_msgs/PoseStamped): not a world-model bag")
        wanted = {}
        for ns in found:
            names = world_model_topics(ns)
            missing = [names[k] for k in ("camera", "pose", "gripper") if names[k] not in topics]
            if missing:
                raise ValueError(f"{bag}: robot {ns} lacks {missing}")
            streams[ns] = {"camera": [], "pose": [], "gripper": []}
            for key in ("camera", "pose", "gripper"):
                wanted[names[key]] = (ns, key)
        conns = [c for c in reader.connections if c.topic in wanted]
        for conn, _t, raw in bag_messages(reader, bag, conns):
            ns, key = wanted[conn.topic]
            msg = reader.deserialize(raw, conn.msgtype)
            stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
            streams[ns][key].append((stamp, msg))
    episodes = []
    for ns, s in streams.items():
        cams = sorted(s["camera"], key=lambda e: e[0])
        poses = sorted(s["pose"], key=lambda e: e[0])
        grips = sorted(s["gripper"], key=lambda e: e[0])
        if not cams or not poses or not grips:
            raise ValueError(f"{bag}: robot {ns} has no camera, pose or gripper messages")
        period = int(1e9 / fps)
        ticks = range(cams[0][0], cams[-1][0] + 1, period)
        cam_stamps = np.array([c[0] for c in cams])
        pose_stamps, grip_stamps = np.array([p[0] for p in poses]), np.array([g[0] for g in grips])
        chosen = sorted({int(np.abs(cam_stamps - t).argmin()) for t in ticks})
        frames, states, stamps = [], [], []
        for i in chosen:
            stamp, img = cams[i][0], cams[i][1]
            p = poses[int(np.abs(pose_stamps - stamp).argmin())][1].pose
            g = grips[int(np.abs(grip_stamps - stamp).argmin())][1]
            quat = torch.tensor([p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w])
            euler = quaternion_to_euler(quat)
            states.append(
                torch.tensor(
                    [p.position.x, p.position.y, p.position.z, *euler.tolist(), float(g.position[0])],
                    dtype=torch.float32,
                )
            )
            frames.append(torch.from_numpy(_image(img)))
            stamps.append(stamp)
        st = torch.stack(states)
        actions = pose_delta(st[:-1], st[1:]) if len(st) > 1 else torch.zeros(0, 7)
        episodes.append(Episode(ns, torch.stack(frames), st, actions.float(), stamps))
    return episodes
