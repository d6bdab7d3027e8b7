"""A synthetic DROID-like rosbag2: camera images and joint states of N robots.

DROID records a Franka arm with a Robotiq gripper, two exterior cameras and a wrist
camera, all at 15 Hz. This generator writes the same kind of data for one or more
robot namespaces (``/robot1``, ``/robot2``, ...):

- ``{ns}/camera/{name}/image_raw`` (``sensor_msgs/msg/Image``) per camera, 15 Hz,
  224 x 224 ``rgb8`` by default. Content is synthetic but not trivial: an exterior
  view of a table with blocks and a planar stick drawing of the arm that follows
  the joint trajectory, and a wrist view of a rotating, sliding table texture with
  the gripper fingers opening and closing.
- ``{ns}/joint_states`` (``sensor_msgs/msg/JointState``), 30 Hz by default: the seven
  Franka joints ``panda_joint1..7`` and the gripper joint
  ``robotiq_85_left_knuckle_joint`` (0 = open, 0.8 rad = closed), with positions,
  velocities (the analytic derivative) and efforts, along smooth trajectories
  around the Franka home pose.

Timestamps are those of a recording: ``header.stamp`` is the capture time (nominal
period plus a little clock jitter), and the bag's receive timestamp is later by a
transport latency (camera 8-30 ms, joint states ~1 ms), so messages of different
topics interleave the way a real ``ros2 bag record`` leaves them. Everything is a
function of the seed: the same spec writes byte-identical messages.

Storage: MCAP, the rosbag2 default storage plugin since Iron (so also on Jazzy and
Kilted; sqlite3 stays available with ``storage="sqlite3"``). MCAP chunks are zstd
compressed here, which rosbag2 reads natively, and our synthetic frames compress well.
Messages are CDR-serialized by ``rosbags`` with its ROS 2 Kilted typestore: the same
bytes rclpy puts on the wire (type hashes equal the Kilted wheels' RIHS01 hashes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_TYPE = "sensor_msgs/msg/Image"
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"
#: Franka Panda arm joints, as in the Franka ROS description DROID's arms use.
ARM_JOINTS = tuple(f"panda_joint{i}" for i in range(1, 8))
#: DROID's gripper is a Robotiq 2F-85; its driving joint, 0 (open) .. 0.8 rad (closed).
GRIPPER_JOINT = "robotiq_85_left_knuckle_joint"
JOINT_NAMES = ARM_JOINTS + (GRIPPER_JOINT,)
GRIPPER_CLOSED = 0.8
#: Franka home pose (rad).
HOME = np.array([0.0, -math.pi / 4, 0.0, -3 * math.pi / 4, 0.0, math.pi / 2, math.pi / 4])
#: Franka joint limits (rad), for clipping the synthetic trajectories.
LOWER = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
UPPER = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
ENCODINGS = {"rgb8": 3, "bgr8": 3, "mono8": 1}
#: custom_data key under which the spec is stored in the bag's metadata.
CUSTOM_DATA_KEY = "mstar_ros.synthetic_spec"
#: 2024-05-01T00:00:00Z: a fixed recording start, so that bags are deterministic.
DEFAULT_START_NS = 1_714_521_600 * 10**9


@dataclass(frozen=True)
class SyntheticBagSpec:
    """What to generate. Every field has a DROID-like default."""

    robots: int = 2
    seconds: float = 20.0
    seed: int = 0
    cameras: tuple[str, ...] = ("exterior", "wrist")
    width: int = 224
    height: int = 224
    encoding: str = "rgb8"
    camera_hz: float = 15.0
    joint_hz: float = 30.0
    namespace_prefix: str = "robot"
    #: the robots' namespaces (e.g. ('/arm_left', '/arm_right')); empty: /robot1 ... /robotN
    #: (``namespace_prefix`` and a number). When given, ``robots`` is their count.
    robot_namespaces: tuple[str, ...] = ()
    start_ns: int = DEFAULT_START_NS
    storage: str = "mcap"
    compress: bool = True

    def __post_init__(self) -> None:
        if self.robot_namespaces:
            from mstar_ros.launch_spec import parse_robots  # the rules `launch --robots` applies

            if parse_robots(self.robot_namespaces) != list(self.robot_namespaces):
                raise ValueError(f"robot_namespaces must be written /name, got {self.robot_namespaces}")
            if self.robots != len(self.robot_namespaces):
                raise ValueError(f"robots is {self.robots} but {len(self.robot_namespaces)} namespaces are given")
        if self.robots < 1:
            raise ValueError(f"robots must be at least 1, got {self.robots}")
        if not self.seconds > 0:
            raise ValueError(f"seconds must be positive, got {self.seconds}")
        if self.width < 16 or self.height < 16:
            raise ValueError(f"images must be at least 16 x 16, got {self.width} x {self.height}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {sorted(ENCODINGS)}, got {self.encoding!r}")
        if not self.cameras or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"cameras must be distinct names, got {self.cameras}")
        for name in self.cameras:
            if not name.replace("_", "").isalnum() or not name[0].isalpha():
                raise ValueError(f"camera name {name!r} is not a valid ROS name token")
        if not (self.camera_hz > 0 and self.joint_hz > 0):
            raise ValueError("camera_hz and joint_hz must be positive")
        if self.storage not in ("mcap", "sqlite3"):
            raise ValueError(f"storage must be 'mcap' or 'sqlite3', got {self.storage!r}")

    @property
    def namespaces(self) -> list[str]:
        if self.robot_namespaces:
            return list(self.robot_namespaces)
        return [f"/{self.namespace_prefix}{i + 1}" for i in range(self.robots)]

    @classmethod
    def for_robots(cls, robots: str | int | Sequence[str], **fields) -> SyntheticBagSpec:
        """A spec for ``robots`` given as `launch --robots` takes them ('/robot1 /robot2',
        'robot1,robot2', a list) or as a count N (/robot1 ... /robotN, and a bare number)."""
        items = [robots] if isinstance(robots, (str, int)) else list(robots)
        if len(items) == 1 and str(items[0]).strip().isdigit():
            return cls(robots=int(str(items[0]).strip()), **fields)
        from mstar_ros.launch_spec import parse_robots

        names = tuple(parse_robots([str(i) for i in items]))
        return cls(robots=len(names), robot_namespaces=names, **fields)

    def topics(self) -> dict[str, str]:
        """Topic -> message type, in the order the connections are written."""
        out: dict[str, str] = {}
        for ns in self.namespaces:
            for cam in self.cameras:
                out[camera_topic(ns, cam)] = IMAGE_TYPE
            out[joint_topic(ns)] = JOINT_STATE_TYPE
        return out

    def expected_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ns in self.namespaces:
            for cam in self.cameras:
                counts[camera_topic(ns, cam)] = _count(self.seconds, self.camera_hz)
            counts[joint_topic(ns)] = _count(self.seconds, self.joint_hz)
        return counts

    def to_json(self) -> str:
        d = asdict(self)
        d["cameras"] = list(self.cameras)
        d["robot_namespaces"] = list(self.robot_namespaces)
        return json.dumps(d, sort_keys=True)


def camera_topic(namespace: str, camera: str) -> str:
    return f"{namespace}/camera/{camera}/image_raw"


def joint_topic(namespace: str) -> str:
    return f"{namespace}/joint_states"


def _count(seconds: float, hz: float) -> int:
    return max(1, int(round(seconds * hz)))


# ----------------------------------------------------------------------------- trajectories


class _Robot:
    """One robot's smooth joint trajectory and scene, all functions of time (s)."""

    def __init__(self, rng: np.random.Generator) -> None:
        # three sinusoids per joint, slower and smaller as the harmonic rises
        self.amp = rng.uniform(0.08, 0.35, (3, 7)) / np.array([[1.0], [2.0], [3.5]])
        self.freq = rng.uniform(0.04, 0.25, (3, 7)) * np.array([[1.0], [1.6], [2.3]])
        self.phase = rng.uniform(0, 2 * np.pi, (3, 7))
        self.grip_freq = rng.uniform(0.06, 0.14)
        self.grip_phase = rng.uniform(0, 2 * np.pi)
        self.effort_scale = rng.uniform(0.5, 1.5, 7) * np.array([1.0, 25.0, 1.0, 12.0, 1.0, 2.0, 0.3])
        # scene: wall/table colours, blocks on the table, a distractor orbit
        self.wall = rng.integers(120, 230, 3)
        self.table = rng.integers(60, 170, 3)
        self.blocks = [
            (rng.uniform(0.1, 0.9), rng.uniform(0.68, 0.92), rng.uniform(0.05, 0.1), rng.integers(0, 256, 3))
            for _ in range(3)
        ]
        self.orbit = (
            rng.uniform(0.2, 0.8),
            rng.uniform(0.2, 0.45),
            rng.uniform(0.08, 0.18),
            rng.uniform(0.2, 0.6),
            rng.integers(0, 256, 3),
        )
        self.texture = (rng.integers(0, 256, 3), rng.integers(0, 256, 3), rng.uniform(10, 20))
        self.clock_phase = rng.uniform(0, 0.02)  # when this robot's sensors start (s)

    def joints(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Arm positions and velocities (7 each) at time t."""
        w = 2 * np.pi * self.freq
        arg = w * t + self.phase
        q = HOME + (self.amp * np.sin(arg)).sum(0)
        dq = (self.amp * w * np.cos(arg)).sum(0)
        return np.clip(q, LOWER + 0.05, UPPER - 0.05), dq

    def gripper(self, t: float) -> tuple[float, float]:
        """Gripper joint position (0 open .. 0.8 closed) and velocity: smooth open/close cycles."""
        w = 2 * np.pi * self.grip_freq
        c = math.cos(w * t + self.grip_phase)
        return 0.5 * GRIPPER_CLOSED * (1 - c), 0.5 * GRIPPER_CLOSED * w * math.sin(w * t + self.grip_phase)

    def efforts(self, q: np.ndarray, grip: float) -> np.ndarray:
        """Gravity-like torques (Nm) and the gripper's grasp force proxy."""
        tau = self.effort_scale * np.cos(q - HOME + 0.3)
        return np.append(tau, 10.0 * grip / GRIPPER_CLOSED)


# ----------------------------------------------------------------------------- images


class _Painter:
    """Draws the frames of one robot's cameras; pure numpy, a few ms per frame."""

    def __init__(self, spec: SyntheticBagSpec, robot: _Robot) -> None:
        self.h, self.w = spec.height, spec.width
        self.robot = robot
        yy, xx = np.mgrid[0 : self.h, 0 : self.w].astype(np.float32)
        self.x, self.y = xx / self.w, yy / self.h  # normalised pixel coordinates
        # exterior background: wall gradient above the table edge, table below with a faint grid
        base = np.empty((self.h, self.w, 3), np.float32)
        wall = robot.wall.astype(np.float32) * (0.75 + 0.25 * (1 - self.y))[..., None]
        table = robot.table.astype(np.float32) * (0.8 + 0.2 * self.y)[..., None]
        on_table = (self.y >= 0.6)[..., None]
        base[:] = np.where(on_table, table, wall)
        lines = (np.abs(((self.x * 8) % 1) - 0.5) > 0.47) | (np.abs(((self.y * 12) % 1) - 0.5) > 0.47)
        grid = lines & (self.y >= 0.6)
        base[grid] *= 0.85
        # vignetting, as on a real lens
        r2 = (self.x - 0.5) ** 2 + (self.y - 0.5) ** 2
        base *= (1 - 0.35 * r2)[..., None]
        self.exterior_base = np.clip(base, 0, 255).astype(np.uint8)

    def _disc(self, img: np.ndarray, cx: float, cy: float, r: float, color: Any) -> None:
        mask = (self.x - cx) ** 2 + ((self.y - cy) * self.h / self.w) ** 2 < r * r
        img[mask] = color

    def _segment(
        self, img: np.ndarray, p: tuple[float, float], q: tuple[float, float], width: float, color: Any
    ) -> None:
        px, py = p
        dx, dy = q[0] - px, q[1] - py
        n2 = dx * dx + dy * dy + 1e-12
        s = np.clip(((self.x - px) * dx + (self.y - py) * dy) / n2, 0, 1)
        d2 = (self.x - px - s * dx) ** 2 + (self.y - py - s * dy) ** 2
        img[d2 < width * width] = color

    def exterior(self, t: float, q: np.ndarray, grip: float, view: int) -> np.ndarray:
        img = self.exterior_base.copy()
        if view % 2:
            img = img[:, ::-1].copy()  # a second exterior camera sees the scene mirrored
        for bx, by, size, color in self.robot.blocks:
            x0, x1 = int((bx - size / 2) * self.w), int((bx + size / 2) * self.w)
            y0, y1 = int((by - size / 2) * self.h), int((by + size / 2) * self.h)
            img[max(y0, 0) : max(y1, 0), max(x0, 0) : max(x1, 0)] = color
        cx, cy, rad, speed, color = self.robot.orbit
        phase = speed * 2 * math.pi * t
        self._disc(img, cx + rad * math.cos(phase), cy + 0.5 * rad * math.sin(phase), 0.04, color)
        # planar stick drawing of the arm: base (joint 1 slides it), shoulder (joint 2),
        # elbow (joint 4) and wrist (joint 6), reaching over the table at the home pose
        d = q - HOME
        base = (0.3 + 0.15 * math.sin(q[0]), 0.95)
        a1 = -math.pi / 2 + 0.3 + 0.8 * d[1]
        p1 = (base[0] + 0.35 * math.cos(a1), base[1] + 0.35 * math.sin(a1))
        a2 = a1 + 1.2 + 0.8 * d[3]
        p2 = (p1[0] + 0.3 * math.cos(a2), p1[1] + 0.3 * math.sin(a2))
        a3 = a2 + 0.6 + d[5]
        p3 = (p2[0] + 0.1 * math.cos(a3), p2[1] + 0.1 * math.sin(a3))
        self._segment(img, base, p1, 0.03, (235, 235, 235))
        self._segment(img, p1, p2, 0.025, (210, 210, 215))
        self._segment(img, p2, p3, 0.02, (60, 60, 60))
        g = int(255 * grip / GRIPPER_CLOSED)
        self._disc(img, p3[0], p3[1], 0.03, (g, 40, 255 - g))
        return img

    def wrist(self, t: float, q: np.ndarray, grip: float) -> np.ndarray:
        c1, c2, period = self.robot.texture
        ang = q[6] - HOME[6] + 0.5 * (q[0] - HOME[0])
        ox, oy = 0.8 * (q[0] - HOME[0]) + 0.1 * t, 0.8 * (q[1] - HOME[1])
        u = (self.x - 0.5) * math.cos(ang) - (self.y - 0.5) * math.sin(ang) + ox
        v = (self.x - 0.5) * math.sin(ang) + (self.y - 0.5) * math.cos(ang) + oy
        k = period / 4
        checker = ((np.floor(u * k) + np.floor(v * k)) % 2).astype(bool)
        img = np.where(checker[..., None], c1.astype(np.uint8), c2.astype(np.uint8))
        # the block under the gripper drifts through the view
        bx = 0.5 + 0.35 * math.sin(0.3 * t + q[2])
        self._disc(img, bx, 0.45, 0.12, self.robot.blocks[0][3])
        # two fingers at the bottom: their gap closes as the gripper closes
        gap = 0.06 + 0.22 * (1 - grip / GRIPPER_CLOSED)
        fw = 0.08
        y0 = int(0.72 * self.h)
        left = slice(max(int((0.5 - gap - fw) * self.w), 0), int((0.5 - gap) * self.w))
        right = slice(int((0.5 + gap) * self.w), min(int((0.5 + gap + fw) * self.w), self.w))
        img[y0:, left] = (30, 30, 30)
        img[y0:, right] = (30, 30, 30)
        return img


def _encode(rgb: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "rgb8":
        return rgb
    if encoding == "bgr8":
        return np.ascontiguousarray(rgb[..., ::-1])
    lum = rgb.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return np.clip(lum + 0.5, 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class SyntheticMessage:
    topic: str
    msgtype: str
    timestamp_ns: int  # receive time, the bag's timestamp
    msg: Any  # a rosbags message object (typestore class)


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


def synthetic_messages(spec: SyntheticBagSpec, typestore=None) -> Iterator[SyntheticMessage]:
    """Every message of the bag, in receive-time order, as rosbags message objects."""
    ts = typestore or _typestore()
    Image = ts.types[IMAGE_TYPE]
    JointState = ts.types[JOINT_STATE_TYPE]
    Header = ts.types["std_msgs/msg/Header"]
    Time = ts.types["builtin_interfaces/msg/Time"]
    channels = ENCODINGS[spec.encoding]

    root = np.random.SeedSequence(spec.seed)
    events: list[tuple[int, int, int, int, int]] = []  # (receive_ns, robot, stream, k, stamp_ns)
    robots: list[_Robot] = []
    painters: list[_Painter] = []
    for r, child in enumerate(root.spawn(spec.robots)):
        scene_seed, timing_seed = child.spawn(2)
        robot = _Robot(np.random.default_rng(scene_seed))
        robots.append(robot)
        painters.append(_Painter(spec, robot))
        timing = np.random.default_rng(timing_seed)
        streams = [(spec.camera_hz, 0.003 * i, (0.008, 0.030)) for i in range(len(spec.cameras))]
        streams.append((spec.joint_hz, 0.0, (0.0005, 0.003)))
        for s, (hz, offset, (lat_lo, lat_hi)) in enumerate(streams):
            n = _count(spec.seconds, hz)
            nominal = robot.clock_phase + offset + np.arange(n) / hz
            stamp = nominal + np.clip(timing.normal(0.0, 0.0005, n), -0.002, 0.002)
            latency = lat_lo + (lat_hi - lat_lo) * timing.beta(2.0, 5.0, n)
            stamp_ns = spec.start_ns + np.round(stamp * 1e9).astype(np.int64)
            recv_ns = stamp_ns + np.round(latency * 1e9).astype(np.int64)
            recv_ns = np.maximum.accumulate(recv_ns)  # a topic's receive times never go back
            events += [(int(recv_ns[k]), r, s, k, int(stamp_ns[k])) for k in range(n)]
    events.sort()

    namespaces = spec.namespaces
    for recv_ns, r, s, _k, stamp_ns in events:
        t = (stamp_ns - spec.start_ns) / 1e9
        robot = robots[r]
        q, dq = robot.joints(t)
        grip, dgrip = robot.gripper(t)
        sec, nsec = divmod(stamp_ns, 10**9)
        ns = namespaces[r]
        robot_name = ns.strip("/")
        if s < len(spec.cameras):
            cam = spec.cameras[s]
            if "wrist" in cam:
                rgb = painters[r].wrist(t, q, grip)
            else:
                rgb = painters[r].exterior(t, q, grip, view=s)
            pixels = _encode(rgb, spec.encoding)
            header = Header(stamp=Time(sec=sec, nanosec=nsec), frame_id=f"{robot_name}/{cam}_camera_optical_frame")
            msg = Image(
                header=header,
                height=spec.height,
                width=spec.width,
                encoding=spec.encoding,
                is_bigendian=0,
                step=spec.width * channels,
                data=pixels.reshape(-1),
            )
            yield SyntheticMessage(camera_topic(ns, cam), IMAGE_TYPE, recv_ns, msg)
        else:
            header = Header(stamp=Time(sec=sec, nanosec=nsec), frame_id=f"{robot_name}/base_link")
            msg = JointState(
                header=header,
                name=list(JOINT_NAMES),
                position=np.append(q, grip),
                velocity=np.append(dq, dgrip),
                effort=robot.efforts(q, grip),
            )
            yield SyntheticMessage(joint_topic(ns), JOINT_STATE_TYPE, recv_ns, msg)


def _qos(reliable: bool, depth: int):
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    zero = QosTime(0, 0)
    return Qos(
        history=QosHistory.KEEP_LAST,
        depth=depth,
        reliability=QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
        durability=QosDurability.VOLATILE,
        deadline=zero,
        lifespan=zero,
        liveliness=QosLiveliness.AUTOMATIC,
        liveliness_lease_duration=zero,
        avoid_ros_namespace_conventions=False,
    )


@dataclass
class BagSummary:
    path: Path
    messages: int
    counts: dict[str, int]
    duration_s: float
    bytes: int


def write_synthetic_bag(path: str | Path, spec: SyntheticBagSpec | None = None) -> BagSummary:
    """Writes the bag directory ``path`` (must not exist) and returns what was written.

    The spec is stored in the bag's ``custom_data`` (key ``mstar_ros.synthetic_spec``).
    Offered QoS recorded per topic: images as a camera driver offers them (sensor
    data: best effort, keep last 5), joint states reliable, keep last 10.
    """
    from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer

    spec = spec or SyntheticBagSpec()
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists already; rosbag2 bags are directories and are never overwritten")
    ts = _typestore()
    plugin = StoragePlugin.MCAP if spec.storage == "mcap" else StoragePlugin.SQLITE3
    writer = Writer(path, version=9, storage_plugin=plugin)
    if spec.compress and spec.storage == "mcap":
        writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)  # zstd MCAP chunks
    counts = dict.fromkeys(spec.topics(), 0)
    first = last = None
    with writer:
        writer.set_custom_data(CUSTOM_DATA_KEY, spec.to_json())
        conns = {}
        for topic, msgtype in spec.topics().items():
            qos = _qos(reliable=False, depth=5) if msgtype == IMAGE_TYPE else _qos(reliable=True, depth=10)
            conns[topic] = writer.add_connection(topic, msgtype, typestore=ts, offered_qos_profiles=[qos])
        for m in synthetic_messages(spec, ts):
            writer.write(conns[m.topic], m.timestamp_ns, ts.serialize_cdr(m.msg, m.msgtype))
            counts[m.topic] += 1
            first = m.timestamp_ns if first is None else first
            last = m.timestamp_ns
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return BagSummary(path, sum(counts.values()), counts, (last - first) / 1e9, size)


def read_spec(path: str | Path) -> SyntheticBagSpec | None:
    """The spec a synthetic bag was written with (None for any other bag)."""
    from mstar_ros.bag.info import bag_custom_data

    raw = bag_custom_data(path).get(CUSTOM_DATA_KEY)
    if not raw:
        return None
    d = json.loads(raw)
    d["cameras"] = tuple(d["cameras"])
    d["robot_namespaces"] = tuple(d.get("robot_namespaces", ()))  # bags written before the field existed
    return SyntheticBagSpec(**d)


def ensure_synthetic_bag(path: str | Path, spec: SyntheticBagSpec | None = None) -> Path:
    """Writes the bag at ``path`` unless a bag written from the same spec is there already.

    For demos and benchmarks that want "the bundled synthetic bag" without rewriting
    it each run. A different bag at ``path`` is an error, never overwritten.
    """
    spec = spec or SyntheticBagSpec()
    path = Path(path)
    if path.exists():
        found = read_spec(path) if (path / "metadata.yaml").exists() else None
        if found == spec:
            return path
        raise FileExistsError(
            f"{path} exists and is not a synthetic bag written from this spec; remove it or choose another path"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_synthetic_bag(path, spec)
    return path
