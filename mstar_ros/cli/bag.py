"""``mstar-ros bag``: make a synthetic DROID-like rosbag2, describe a bag, play a bag into ROS 2."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mstar_ros.bag.bag_clock import DEFAULT_HZ as DEFAULT_CLOCK_HZ  # no rclpy import at import time

BAG_DESCRIPTION = """\
rosbag2 tools that need no ROS install beyond the PyPI wheels (the `ros` extra):

  make  write a synthetic DROID-like bag: per robot namespace (/robot1, /robot2, ...)
        camera images (sensor_msgs/Image) and Franka + gripper joint states
        (sensor_msgs/JointState) at recorded timestamps; deterministic from --seed.
  info  topics, types, counts, rates, duration and storage of a bag.
  play  publish a bag into ROS 2 at its recorded timing (like `ros2 bag play`).

DDS stays on this host unless you set ROS_AUTOMATIC_DISCOVERY_RANGE (other than
LOCALHOST) or FASTDDS_DEFAULT_PROFILES_FILE yourself: by default the Fast DDS profile
config/fastdds_localhost.xml (32 MB shared memory, UDP and discovery on 127.0.0.1 only,
no multicast) is applied."""

PLAY_DESCRIPTION = """\
Publish the messages of BAG (a rosbag2 directory, or a .mcap / .db3 file) into
ROS 2 with rclpy, each at its recorded time relative to the bag start divided by
--rate, scheduled on one monotonic clock (a late message never delays the ones
after it). The recorded bytes are published as they are.

Before the first message it waits until every played topic has a subscriber
(never a blind sleep): a subscriber started after `bag play` still gets the first
messages. If some topic has none after --wait-timeout seconds it exits with status
1 and names those topics. It then waits --settle seconds more, because the
subscriber's side of DDS discovery completes a little after the publisher's and a
best-effort subscriber would otherwise lose the first message.

QoS: reliable, keep last --depth, volatile. A reliable publisher matches reliable
and best-effort (sensor-data QoS) subscribers alike; a best-effort one matches only
best-effort subscribers. Keep-last history never blocks the player on a slow
subscriber.

Prints the topics, progress every --progress seconds, and a summary: messages
per topic, achieved rate (bag seconds per wall second) and publish lateness.
Ctrl-C or SIGTERM stops playback with the summary.

Examples:
  mstar-ros bag make out/droid_synthetic
  mstar-ros bag play out/droid_synthetic --rate 2
  mstar-ros bag play out/droid_synthetic --loop --topics /robot1 \\
      --remap /robot1:=/arm_left --remap /arm_left/joint_states:=/arm_left/joints
  mstar-ros launch pi05 --use-sim-time & mstar-ros bag play out/droid_synthetic --clock"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    bag = sub.add_parser(
        "bag",
        help="rosbag2: make a synthetic DROID-like bag, show a bag, play a bag into ROS 2",
        description=BAG_DESCRIPTION,
        formatter_class=raw,
    )
    bag_sub = bag.add_subparsers(dest="bag_command", required=True, metavar="BAG_COMMAND")

    m = bag_sub.add_parser(
        "make",
        help="write a synthetic DROID-like rosbag2 (images + joint states per robot)",
        formatter_class=raw,
        description="Write a synthetic DROID-like rosbag2 directory OUT with rosbags (MCAP with zstd chunks "
        "by default: rosbag2's default storage since Iron). Per robot namespace NS (--robots): "
        "CAMERA topics NS/camera/<name>/image_raw (sensor_msgs/Image, moving synthetic "
        "scenes), and NS/joint_states (sensor_msgs/JointState: panda_joint1..7 and "
        "robotiq_85_left_knuckle_joint, smooth trajectories with velocities and efforts). "
        "header.stamp is the capture time; the bag timestamp is the receive time a few ms "
        "later, with realistic jitter. The same options always write the same messages.",
    )
    m.add_argument("out", type=Path, metavar="OUT", help="bag directory to create (must not exist)")
    m.add_argument(
        "--robots",
        nargs="+",
        default=["/robot1", "/robot2"],
        metavar="NS",
        help="robot namespaces, as `mstar-ros launch pi05 --robots` takes them: /robot1 /robot2, "
        "or robot1,robot2 (default /robot1 /robot2); a single number N means /robot1 ... /robotN",
    )
    m.add_argument("--seconds", type=float, default=20.0, help="recording length (default 20)")
    m.add_argument("--seed", type=int, default=0, help="seed of trajectories, scenes and jitter (default 0)")
    m.add_argument("--size", default="224x224", help="image WIDTHxHEIGHT (default 224x224)")
    m.add_argument(
        "--cameras",
        default="exterior,wrist",
        help="comma-separated camera names; a name containing 'wrist' gets the wrist view "
        "(default exterior,wrist; DROID has exterior_1,exterior_2,wrist)",
    )
    m.add_argument(
        "--encoding", default="rgb8", choices=["rgb8", "bgr8", "mono8"], help="image encoding (default rgb8)"
    )
    m.add_argument("--camera-hz", type=float, default=15.0, help="camera rate (default 15, as DROID)")
    m.add_argument("--joint-hz", type=float, default=30.0, help="joint state rate (default 30)")
    m.add_argument("--storage", default="mcap", choices=["mcap", "sqlite3"], help="rosbag2 storage (default mcap)")
    m.add_argument("--no-compress", action="store_true", help="MCAP chunks without zstd")
    m.set_defaults(run=_run_make)

    w = bag_sub.add_parser(
        "make-world-model",
        help="write a synthetic DROID-like bag for a world model (camera, end-effector pose, gripper, actions)",
        description="Write a synthetic rosbag2 directory OUT for V-JEPA 2-AC (MCAP, zstd chunks), per robot "
        "/robot1 .. /robotN: NS/camera/exterior/image_raw (sensor_msgs/Image rgb8, the gripper drawn "
        "where the end effector is), NS/ee_pose (geometry_msgs/PoseStamped, gripper pointing down), "
        "NS/gripper/joint_states (sensor_msgs/JointState, 0 open .. 1 closed) and NS/action "
        "(std_msgs/Float64MultiArray: the 7-d action between consecutive poses, as Meta's code derives "
        "it), all at --hz. Deterministic from --seed. `mstar-ros bench rollout --bag OUT` reads it.",
    )
    w.add_argument("out", type=Path, metavar="OUT", help="bag directory to create (must not exist)")
    w.add_argument("--robots", type=int, default=1, help="robots /robot1 .. /robotN (default 1)")
    w.add_argument("--seconds", type=float, default=12.0, help="recording length (default 12)")
    w.add_argument("--hz", type=float, default=15.0, help="rate of every topic (default 15, as DROID's cameras)")
    w.add_argument("--size", default="256x256", help="image WIDTHxHEIGHT (default 256x256)")
    w.add_argument("--seed", type=int, default=0, help="seed of trajectories and scenes (default 0)")
    w.set_defaults(run=_run_make_world_model)

    i = bag_sub.add_parser(
        "info",
        help="topics, types, counts, rates and duration of a bag",
        description="Describe a rosbag2 (directory, .mcap or .db3) read with rosbags: "
        "storage, size, start, duration, and per topic its type, message "
        "count, mean rate and recorded offered QoS.",
    )
    i.add_argument("bag", type=Path, metavar="BAG")
    i.set_defaults(run=_run_info)

    p = bag_sub.add_parser(
        "play",
        help="publish a bag into ROS 2 at its recorded timing (waits for subscribers)",
        description=PLAY_DESCRIPTION,
        formatter_class=raw,
    )
    p.add_argument("bag", type=Path, metavar="BAG")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor: 2 plays twice as fast (default 1)")
    p.add_argument("--loop", action="store_true", help="play the bag again and again until stopped")
    p.add_argument(
        "--topics",
        nargs="+",
        metavar="TOPIC",
        help="play only these topics; a namespace (e.g. /robot1) selects every topic under it "
        "(give BAG before --topics)",
    )
    p.add_argument(
        "--remap",
        action="append",
        default=[],
        metavar="FROM:=TO",
        help="publish topic FROM as TO; FROM may be a namespace (/robot1:=/left renames "
        "/robot1/joint_states to /left/joint_states). Repeatable; exact topics win over namespaces",
    )
    p.add_argument(
        "--wait-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a subscriber on every topic before giving up (default 30)",
    )
    p.add_argument("--no-wait", action="store_true", help="start publishing at once, subscribers or not")
    p.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds between the last subscriber match and the first message (default 0.5)",
    )
    p.add_argument(
        "--reliability",
        default="reliable",
        choices=["reliable", "best_effort"],
        help="publisher reliability (default reliable: matches every subscriber)",
    )
    p.add_argument("--depth", type=int, default=10, help="publisher keep-last history depth (default 10)")
    p.add_argument(
        "--restamp",
        action="store_true",
        help="set header.stamp to the publish time (ROS clock) instead of the recorded stamp",
    )
    p.add_argument(
        "--clock",
        nargs="?",
        type=float,
        const=DEFAULT_CLOCK_HZ,
        metavar="HZ",
        help=f"publish the bag time being played on /clock (rosgraph_msgs/Clock) at HZ (default "
        f"{DEFAULT_CLOCK_HZ:g}), as `ros2 bag play --clock`: nodes started with use_sim_time:=true "
        "(`mstar-ros launch ... --use-sim-time`) then judge the recorded stamps by the recording's "
        "time; it waits for a /clock subscriber as for the topics; with --loop the clock starts "
        "over with each pass (give BAG before --clock)",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        metavar="SECONDS",
        help="stop after this many seconds of playback (wall clock), e.g. with --loop",
    )
    p.add_argument(
        "--progress",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between progress lines; 0 for none (default 2)",
    )
    p.add_argument("--node-name", default="mstar_bag_player", help="ROS node name (default mstar_bag_player)")
    p.set_defaults(run=_run_play)


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size expects WIDTHxHEIGHT, e.g. 224x224, got {text!r}") from None
    return w, h


def _run_make_world_model(args: argparse.Namespace) -> int:
    from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag

    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size must be WIDTHxHEIGHT, got {args.size!r}") from None
    spec = EndEffectorBagSpec(
        robots=args.robots, seconds=args.seconds, seed=args.seed, width=width, height=height, hz=args.hz
    )
    started = time.perf_counter()
    write_end_effector_bag(args.out, spec)
    print(
        f"wrote {args.out}: {spec.robots} robot(s), {spec.frames} frames each at {spec.hz:g} Hz "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return 0


def _run_make(args: argparse.Namespace) -> int:
    from mstar_ros.bag.synthetic import SyntheticBagSpec, write_synthetic_bag

    width, height = _parse_size(args.size)
    cameras = tuple(c.strip() for c in args.cameras.split(",") if c.strip())
    spec = SyntheticBagSpec.for_robots(
        args.robots,
        seconds=args.seconds,
        seed=args.seed,
        cameras=cameras,
        width=width,
        height=height,
        encoding=args.encoding,
        camera_hz=args.camera_hz,
        joint_hz=args.joint_hz,
        storage=args.storage,
        compress=not args.no_compress,
    )
    t = time.perf_counter()
    try:
        summary = write_synthetic_bag(args.out, spec)
    except FileExistsError as exc:
        print(f"mstar-ros bag make: error: {exc}", file=sys.stderr)
        return 2
    took = time.perf_counter() - t
    print(
        f"wrote {summary.path}: {summary.messages} messages on {len(summary.counts)} topics, "
        f"{summary.duration_s:.2f} s, {summary.bytes / 2**20:.1f} MiB ({spec.storage}) in {took:.1f} s"
    )
    for topic, n in summary.counts.items():
        print(f"  {topic}  {n} msgs")
    return 0


def _bag_error(command: str, exc: Exception) -> int:
    """A broken bag: one line naming the file (mstar_ros.bag.open_bag), exit status 2."""
    print(f"mstar-ros bag {command}: error: {exc}", file=sys.stderr)
    return 2


def _run_info(args: argparse.Namespace) -> int:
    from mstar_ros.bag.info import format_info, read_info
    from mstar_ros.bag.open_bag import BagError

    try:
        print(format_info(read_info(args.bag)))
    except BagError as exc:
        return _bag_error("info", exc)
    return 0


def _run_play(args: argparse.Namespace) -> int:
    from mstar_ros.bag.open_bag import BagError
    from mstar_ros.bag.player import NoSubscribersError, PlayOptions, parse_remaps, play

    options = PlayOptions(
        rate=args.rate,
        loop=args.loop,
        topics=args.topics,
        remap=parse_remaps(args.remap),
        wait=not args.no_wait,
        wait_timeout=args.wait_timeout,
        settle=args.settle,
        reliability=args.reliability,
        depth=args.depth,
        restamp=args.restamp,
        clock_hz=args.clock,
        stop_after=args.stop_after,
        progress_every=args.progress,
        node_name=args.node_name,
    )
    try:
        play(args.bag, options)
    except NoSubscribersError as exc:
        print(f"mstar-ros bag play: {exc}", file=sys.stderr)
        return 1
    except BagError as exc:
        return _bag_error("play", exc)
    return 0
