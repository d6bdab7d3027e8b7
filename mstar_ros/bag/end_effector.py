"""A synthetic DROID-like rosbag2 for a world model: camera, end-effector pose, gripper, actions.

What V-JEPA 2-AC reads from DROID, per robot namespace NS (``/robot1``, ...):

- ``NS/camera/exterior/image_raw`` (``sensor_msgs/msg/Image``, rgb8, 15 Hz like DROID): a
  table seen from the side with blocks and the gripper drawn where the end effector is
  (its size follows the height, its opening the gripper), so frames follow the poses.
- ``NS/ee_pose`` (``geometry_msgs/msg/PoseStamped``, 15 Hz, frame ``NS/base_link``): the
  Franka end effector moving smoothly around (0.55, 0, 0.3) m with the gripper pointing down
  (roll near pi, so Euler angles wrap as in DROID's recordings).
- ``NS/gripper/joint_states`` (``sensor_msgs/msg/JointState``, 15 Hz): the gripper joint,
  0 (open) .. 1 (closed) as DROID's ``gripper_position``.
- ``NS/action`` (``std_msgs/msg/Float64MultiArray``, 15 Hz): the 7-d action taken at each
  frame as Meta's code derives it from consecutive poses (dxyz, the rotation R_next R^T as
  extrinsic xyz angles, dgripper).

Stamps and receive times like a recording (capture time, then a few ms of transport).
Deterministic from the seed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mstar_ros.bag.synthetic import DEFAULT_START_NS, SyntheticMessage, _qos, _typestore

IMAGE_TYPE = "sensor_msgs/msg/Image"
POSE_TYPE = "geometry_msgs/msg/PoseStamped"
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"
ACTION_TYPE = "std_msgs/msg/Float64MultiArray"
GRIPPER_JOINT = "robotiq_85_left_knuckle_joint"
CUSTOM_DATA_KEY = "mstar_ros.end_effector_spec"


def world_model_topics(namespace: str) -> dict[str, str]:
    """The default topic of each stream under a robot namespace."""
    return {
        "camera": f"{namespace}/camera/exterior/image_raw",
        "pose": f"{namespace}/ee_pose",
        "gripper": f"{namespace}/gripper/joint_states",
        "action": f"{namespace}/action",
    }


@dataclass(frozen=True)
class EndEffectorBagSpec:
    robots: int = 1
    seconds: float = 12.0
    seed: int = 0
    width: int = 256
    height: int = 256
    hz: float = 15.0
    start_ns: int = DEFAULT_START_NS

    def __post_init__(self) -> None:
        if self.robots < 1 or not self.seconds > 0 or not self.hz > 0:
            raise ValueError(f"robots >= 1, seconds > 0 and hz > 0 are needed, got {self}")
        if self.width < 16 or self.height < 16:
            raise ValueError(f"images must be at least 16 x 16, got {self.width} x {self.height}")

    @property
    def namespaces(self) -> list[str]:
        return [f"/robot{i + 1}" for i in range(self.robots)]

    @property
    def frames(self) -> int:
        return max(2, int(round(self.seconds * self.hz)))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class _Arm:
    """One robot's end-effector trajectory (functions of time) and scene colours."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.amp = rng.uniform(0.04, 0.12, 3)
        self.freq = rng.uniform(0.05, 0.2, 3)
        self.phase = rng.uniform(0, 2 * np.pi, 3)
        self.rot_amp = rng.uniform(0.05, 0.25, 3)
        self.rot_freq = rng.uniform(0.03, 0.12, 3)
        self.grip_freq = rng.uniform(0.05, 0.12)
        self.wall, self.table = rng.integers(120, 230, 3), rng.integers(60, 170, 3)
        self.blocks = [(rng.uniform(0.15, 0.85), rng.uniform(0.65, 0.9), rng.integers(0, 256, 3)) for _ in range(3)]

    def pose(self, t: float) -> np.ndarray:
        """[x, y, z, roll, pitch, yaw, gripper] at time t."""
        xyz = np.array([0.55, 0.0, 0.3]) + self.amp * np.sin(2 * np.pi * self.freq * t + self.phase)
        rpy = np.array([math.pi, 0.0, 0.0]) + self.rot_amp * np.sin(2 * np.pi * self.rot_freq * t + self.phase)
        rpy[0] = (rpy[0] + math.pi) % (2 * math.pi) - math.pi  # roll around +-pi wraps
        grip = 0.5 * (1 - math.cos(2 * math.pi * self.grip_freq * t))
        return np.concatenate([xyz, rpy, [grip]])

    def image(self, pose: np.ndarray, h: int, w: int) -> np.ndarray:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        x, y = xx / w, yy / h
        img = np.where(
            (y >= 0.6)[..., None],
            self.table * (0.8 + 0.2 * y)[..., None],
            self.wall * (0.75 + 0.25 * (1 - y))[..., None],
        ).astype(np.float32)
        for bx, by, color in self.blocks:
            img[(np.abs(x - bx) < 0.05) & (np.abs(y - by) < 0.04)] = color
        cx = 0.5 + (pose[1] / 0.3)  # y -> image x
        cy = 0.85 - (pose[2] - 0.1) / 0.5  # z -> image y (higher is up)
        size = 0.04 + 0.1 * (pose[0] - 0.4)  # closer to the camera is bigger
        opening = size * (1.2 - pose[6])
        yaw = pose[5]
        for side in (-1, 1):  # two fingers, turned with the yaw
            fx = cx + side * opening * math.cos(yaw)
            fy = cy + side * opening * math.sin(yaw) * 0.3
            img[((x - fx) ** 2 + ((y - fy) * h / w) ** 2) < (size * 0.35) ** 2] = (40, 40, 40)
        img[((x - cx) ** 2 + ((y - cy + size) * h / w) ** 2) < (size * 0.6) ** 2] = (200, 200, 210)
        return np.clip(img, 0, 255).astype(np.uint8)


def _quaternion(rpy: np.ndarray) -> tuple[float, float, float, float]:
    """Extrinsic xyz angles -> (x, y, z, w), as geometry_msgs/Quaternion orders them."""
    r, p, y = rpy / 2
    cr, sr, cp, sp, cy, sy = math.cos(r), math.sin(r), math.cos(p), math.sin(p), math.cos(y), math.sin(y)
    return (
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
        cr * cp * cy + sr * sp * sy,
    )


def end_effector_messages(spec: EndEffectorBagSpec, typestore=None) -> Iterator[SyntheticMessage]:
    import torch

    from mstar_graphs.vjepa2.pose import pose_delta

    ts = typestore or _typestore()
    Image, Pose, PoseStamped = ts.types[IMAGE_TYPE], ts.types["geometry_msgs/msg/Pose"], ts.types[POSE_TYPE]
    Point, Quaternion = ts.types["geometry_msgs/msg/Point"], ts.types["geometry_msgs/msg/Quaternion"]
    JointState, Action = ts.types[JOINT_STATE_TYPE], ts.types[ACTION_TYPE]
    Layout, Dim = ts.types["std_msgs/msg/MultiArrayLayout"], ts.types["std_msgs/msg/MultiArrayDimension"]
    Header, Time = ts.types["std_msgs/msg/Header"], ts.types["builtin_interfaces/msg/Time"]
    events = []
    for r, child in enumerate(np.random.SeedSequence(spec.seed).spawn(spec.robots)):
        rng = np.random.default_rng(child)
        arm = _Arm(rng)
        ns = spec.namespaces[r]
        topics = world_model_topics(ns)
        poses = [arm.pose(k / spec.hz) for k in range(spec.frames + 1)]
        for k in range(spec.frames):
            stamp = spec.start_ns + int(round((k / spec.hz + rng.normal(0, 0.0005)) * 1e9))
            sec, nsec = divmod(stamp, 10**9)
            header = Header(stamp=Time(sec=sec, nanosec=nsec), frame_id=f"{ns.strip('/')}/base_link")
            pose = poses[k]
            q = _quaternion(pose[3:6])
            ee = PoseStamped(
                header=header,
                pose=Pose(
                    position=Point(x=pose[0], y=pose[1], z=pose[2]),
                    orientation=Quaternion(x=q[0], y=q[1], z=q[2], w=q[3]),
                ),
            )
            grip = JointState(
                header=header,
                name=[GRIPPER_JOINT],
                position=np.array([pose[6]]),
                velocity=np.array([], dtype=np.float64),
                effort=np.array([], dtype=np.float64),
            )
            delta = pose_delta(torch.from_numpy(pose), torch.from_numpy(poses[k + 1])).numpy()
            action = Action(
                layout=Layout(dim=[Dim(label="action", size=7, stride=7)], data_offset=0), data=delta.astype(np.float64)
            )
            cam_header = Header(
                stamp=Time(sec=sec, nanosec=nsec), frame_id=f"{ns.strip('/')}/exterior_camera_optical_frame"
            )
            image = Image(
                header=cam_header,
                height=spec.height,
                width=spec.width,
                encoding="rgb8",
                is_bigendian=0,
                step=spec.width * 3,
                data=arm.image(pose, spec.height, spec.width).reshape(-1),
            )
            for i, (key, msgtype, msg, latency) in enumerate(
                [
                    ("camera", IMAGE_TYPE, image, 0.012),
                    ("pose", POSE_TYPE, ee, 0.001),
                    ("gripper", JOINT_STATE_TYPE, grip, 0.001),
                    ("action", ACTION_TYPE, action, 0.002),
                ]
            ):
                events.append((stamp + int(latency * 1e9) + r * 1000 + i, topics[key], msgtype, msg))
    events.sort(key=lambda e: e[0])
    for recv, topic, msgtype, msg in events:
        yield SyntheticMessage(topic, msgtype, recv, msg)


def write_end_effector_bag(path: str | Path, spec: EndEffectorBagSpec | None = None) -> Path:
    """Writes the bag directory ``path`` (must not exist): MCAP, zstd chunks, the spec in custom_data."""
    from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer

    spec = spec or EndEffectorBagSpec()
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists already; rosbag2 bags are directories and are never overwritten")
    ts = _typestore()
    writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
    writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
    with writer:
        writer.set_custom_data(CUSTOM_DATA_KEY, spec.to_json())
        conns = {}
        for ns in spec.namespaces:
            for key, topic in world_model_topics(ns).items():
                msgtype = {"camera": IMAGE_TYPE, "pose": POSE_TYPE, "gripper": JOINT_STATE_TYPE, "action": ACTION_TYPE}[
                    key
                ]
                qos = _qos(reliable=key != "camera", depth=5 if key == "camera" else 10)
                conns[topic] = writer.add_connection(topic, msgtype, typestore=ts, offered_qos_profiles=[qos])
        for m in end_effector_messages(spec, ts):
            writer.write(conns[m.topic], m.timestamp_ns, ts.serialize_cdr(m.msg, m.msgtype))
    return path
