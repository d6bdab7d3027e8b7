"""The V-JEPA 2-AC node set over real DDS, driven by a world-model bag or a scripted feed: the session's KV
grows then stays within its window, a goal image leads to published plans, bad input is reported and dropped
(stamps off the clock, values out of bounds, floods), a seed reproduces a plan."""

from __future__ import annotations

import json
import math
import sys
import threading
import time

import pytest

from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag
from mstar_ros.launch_spec import vjepa2_processes

WINDOW = 4
HORIZON = 2


@pytest.fixture(scope="module")
def wm_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("wm_bag") / "wm"
    write_end_effector_bag(path, EndEffectorBagSpec(robots=1, seconds=6.0, seed=1, width=64, height=64))
    return path


def _values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_world_model_session_plans_toward_a_goal_and_drops_bad_input(procs, start_player, wm_bag, ros_client, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import PoseStamped
    from nav_msgs.msg import Path
    from sensor_msgs.msg import Image
    from std_msgs.msg import Float64

    for msg_type, topic in (
        (PoseStamped, "/robot1/plan/target_pose"),
        (Path, "/robot1/plan/path"),
        (Float64, "/robot1/plan/energy"),
        (Float64, "/robot1/plan/gripper"),
        (DiagnosticArray, "/diagnostics"),
    ):
        ros_client.subscribe(msg_type, topic, depth=200)
    summary_path = tmp_path / "summary.json"
    (spec,) = vjepa2_processes(
        "/robot1",
        extra_arguments=["--duration", "120", "--summary-json", str(summary_path)],
        ros_arguments=[
            "-p",
            f"window_frames:={WINDOW}",
            "-p",
            f"plan_horizon:={HORIZON}",
            "-p",
            "plan_samples:=8",
            "-p",
            "plan_topk:=4",
            "-p",
            "plan_iterations:=2",
            "-p",
            "report_period_s:=0.0",
        ],
    )
    node_set = procs(*spec.command(python=sys.executable))
    goal_pub = ros_client.publisher(Image, "/robot1/goal_image")
    camera_pub = ros_client.publisher(Image, "/robot1/camera/exterior/image_raw")
    pose_pub = ros_client.publisher(PoseStamped, "/robot1/ee_pose")
    ros_client.wait_for(
        lambda: goal_pub.get_subscription_count() > 0 and camera_pub.get_subscription_count() > 0,
        60,
        "the world-model node's subscriptions",
        [node_set],
    )

    def image(encoding: str = "rgb8", size: int = 64) -> Image:
        msg = Image(encoding=encoding, width=size, height=size, step=size * 3)
        msg.header.stamp = ros_client.node.get_clock().now().to_msg()
        msg.data = bytes(range(256)) * (size * size * 3 // 256)
        return msg

    time.sleep(0.5)  # the subscriber's side of discovery completes a little after the publisher's
    goal_pub.publish(image())  # before any frame: reported and dropped
    # the node reads the camera, the pose and the gripper (not the recorded actions: it derives them)
    player = start_player(wm_bag, "--topics", "/robot1/camera", "/robot1/ee_pose", "/robot1/gripper")

    def node_status():
        for got in reversed(ros_client.got("/diagnostics")):
            for status in got.msg.status:
                if status.name == "mstar: /robot1/world_model":
                    return _values(status), status
        return None, None

    ros_client.wait_for(
        lambda: int((node_status()[0] or {}).get("frames", "0")) >= 3, 60, "3 frames in the session", [node_set, player]
    )
    bad_image = image(encoding="16UC1")
    bad_image.step = 64 * 2
    bad_image.data = bytes(64 * 64 * 2)
    camera_pub.publish(bad_image)
    nan_pose = PoseStamped()
    nan_pose.header.stamp = ros_client.node.get_clock().now().to_msg()
    nan_pose.pose.position.x = float("nan")
    nan_pose.pose.orientation.w = 1.0
    pose_pub.publish(nan_pose)
    goal_pub.publish(image())
    ros_client.wait_for(lambda: len(ros_client.got("/robot1/plan/path")) >= 3, 90, "3 plans", [node_set, player])

    def engine_counters():
        out = []
        for got in ros_client.got("/diagnostics"):
            for status in got.msg.status:
                values = _values(status)
                if "worker0.ar:predictor.context_blocks" in values:
                    out.append(
                        (
                            int(values["worker0.ar:predictor.context_blocks"]),
                            int(values["worker0.ar:predictor.window_slides"]),
                        )
                    )
        return out

    ros_client.wait_for(
        lambda: any(slides >= 2 for _, slides in engine_counters()), 60, "the window to slide twice", [node_set, player]
    )
    assert node_set.interrupt() == 0, node_set.output
    player.interrupt()

    paths = [g.msg for g in ros_client.got("/robot1/plan/path")]
    assert all(len(p.poses) == HORIZON for p in paths)
    targets = [g.msg for g in ros_client.got("/robot1/plan/target_pose")]
    assert len(targets) >= 3 and all(t.header.frame_id == "robot1/base_link" for t in targets)
    for t, p in zip(targets, paths):
        assert t.pose.position.x == p.poses[0].pose.position.x
        q = t.pose.orientation
        assert abs(math.sqrt(q.x**2 + q.y**2 + q.z**2 + q.w**2) - 1) < 1e-6
    energies = [g.msg.data for g in ros_client.got("/robot1/plan/energy")]
    assert energies and all(math.isfinite(e) and e > 0 for e in energies)
    assert all(0.0 <= g.msg.data <= 1.0 for g in ros_client.got("/robot1/plan/gripper"))

    # the session's KV grew frame by frame, then stayed within the window (the pending frame is not in it)
    blocks = [b for b, _ in engine_counters()]
    assert max(blocks) <= WINDOW - 1, blocks
    assert any(later > earlier for earlier, later in zip(blocks, blocks[1:])), blocks

    whole = json.loads(summary_path.read_text())
    from mstar.engine.dtype_choice import resolve_dtype

    assert whole["dtype"] == resolve_dtype("auto").describe()  # decided by the Worker, with its reason
    summary = whole["robots"]["/robot1"]
    assert summary["plans"] >= 3 and summary["goals"] == 1 and summary["frames"] >= 5, summary
    assert summary["dropped"] >= 3, node_set.output
    assert summary["frames_failed"] == 0 and summary["plans_failed"] == 0, summary
    out = node_set.output
    assert "a goal before any frame" in out and "16UC1" in out and "position x nan is not finite" in out, out


@pytest.mark.timeout(60)
def test_parameters_that_cannot_work_exit_2_naming_the_parameter(procs):
    (spec,) = vjepa2_processes("/robot1", ros_arguments=["-p", "plan_samples:=4", "-p", "plan_topk:=8"])
    node_set = procs(*spec.command(python=sys.executable))
    assert node_set.proc.wait(timeout=50) == 2, node_set.output
    node_set._reader.join(timeout=5)
    assert "parameter plan_topk: 8 is more than plan_samples=4" in node_set.output
    assert "Traceback" not in node_set.output


SIZE = 32  # the scripted feed's frames (pixels a side)


class WorldModelFeed:
    """One robot's camera, end-effector pose and gripper, published together as a driver stack would, stamped
    with the ROS clock. ``send`` publishes one set (optionally with other stamps or values); ``run`` publishes
    sets at ``hz`` from a thread until ``stop``, taking one-shot changes from ``next_set``."""

    def __init__(self, client, ns: str) -> None:
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState

        self.client, self.ns = client, ns
        self.camera = client.publisher(Image, f"{ns}/camera/exterior/image_raw")
        self.pose = client.publisher(PoseStamped, f"{ns}/ee_pose")
        self.gripper = client.publisher(JointState, f"{ns}/gripper/joint_states")
        self.goal = client.publisher(Image, f"{ns}/goal_image")
        self.next_set: dict = {}
        self.sets = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wait_for_node(self, procs) -> None:
        self.client.wait_for(
            lambda: all(p.get_subscription_count() > 0 for p in (self.camera, self.pose, self.gripper, self.goal)),
            60,
            f"{self.ns}'s world-model subscriptions",
            procs,
        )

    def image(self, stamp, size: int = SIZE, shade: int = 0):
        from sensor_msgs.msg import Image

        msg = Image(encoding="rgb8", width=size, height=size, step=size * 3)
        msg.header.stamp = stamp
        msg.data = bytes((i + shade) % 256 for i in range(256)) * (size * size * 3 // 256)
        return msg

    def send(
        self, *, ahead_s: float = 0.0, x: float = 0.5, grip: float = 0.2, size: int = SIZE, settle_s: float = 0.0
    ) -> None:
        """``settle_s``: the frame goes out that much after the pose and gripper (stamped then), so that they
        are surely in first (topics are not ordered with each other)."""
        from geometry_msgs.msg import PoseStamped
        from rclpy.duration import Duration
        from sensor_msgs.msg import JointState

        now = self.client.node.get_clock().now()
        stamp = (
            (now + Duration(nanoseconds=int(ahead_s * 1e9))).to_msg()
            if ahead_s >= 0
            else (now - Duration(nanoseconds=int(-ahead_s * 1e9))).to_msg()
        )
        pose = PoseStamped()
        pose.header.stamp = stamp
        pose.pose.position.x, pose.pose.position.z = x, 0.3
        pose.pose.orientation.w = 1.0
        self.pose.publish(pose)
        joints = JointState(name=["robotiq_85_left_knuckle_joint"], position=[grip])
        joints.header.stamp = stamp
        self.gripper.publish(joints)
        if settle_s:
            time.sleep(settle_s)
            stamp = self.client.node.get_clock().now().to_msg()
        self.camera.publish(self.image(stamp, size))
        self.sets += 1

    def run(self, hz: float = 8.0) -> WorldModelFeed:
        def loop() -> None:
            while not self._stop.is_set():
                change, self.next_set = self.next_set, {}
                self.send(**change)
                time.sleep(1.0 / hz)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def once(self, timeout: float = 10.0, **change) -> None:
        """The running feed's next set with ``change`` (waits until it went out)."""
        self.next_set = change
        deadline = time.monotonic() + timeout
        while self.next_set and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _robot_status(ros_client, ns: str) -> dict[str, str]:
    for got in reversed(ros_client.got("/diagnostics")):
        for status in got.msg.status:
            if status.name == f"mstar: {ns}/world_model":
                return _values(status)
    return {}


def _frames(ros_client, ns: str) -> int:
    return int(_robot_status(ros_client, ns).get("frames", "0"))


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_stamps_off_the_clock_and_values_out_of_bounds_are_refused_on_their_topic(procs, ros_client, tmp_path):
    """One set stamped 1e6 s ahead no longer freezes the session (issue 28.8); a pose of x=1e300, a NaN gripper,
    an old stamp and a frame of another size are each refused on arrival, counted on their own topic and said
    throttled, and never reach the engine (issue 28.9)."""
    from diagnostic_msgs.msg import DiagnosticArray

    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=200)
    summary_path = tmp_path / "summary.json"
    (spec,) = vjepa2_processes(
        "/robot1",
        extra_arguments=["--duration", "120", "--summary-json", str(summary_path)],
        ros_arguments=["-p", "fps:=8.0", "-p", "plan_samples:=8", "-p", "plan_topk:=4"],
    )
    node_set = procs(*spec.command(python=sys.executable))
    feed = WorldModelFeed(ros_client, "/robot1")
    feed.wait_for_node([node_set])
    feed.run(hz=8.0)
    try:
        ros_client.wait_for(lambda: _frames(ros_client, "/robot1") >= 2, 60, "2 frames", [node_set])
        feed.once(ahead_s=1e6)  # camera, pose and gripper stamped 11.6 days ahead
        frozen_at = _frames(ros_client, "/robot1")
        ros_client.wait_for(
            lambda: _frames(ros_client, "/robot1") >= frozen_at + 4,
            20,
            "frames to go on after a set stamped 1e6 s ahead",
            [node_set],
        )
        feed.once(ahead_s=-100.0)  # 100 s old
        for _ in range(3):
            feed.once(x=1e300)  # a pose far off any workspace (inf in float32)
            feed.once(grip=float("nan"))
        feed.once(size=SIZE * 2)  # the camera's size changed (image_height/width 0)
        frames = _frames(ros_client, "/robot1")
        ros_client.wait_for(
            lambda: _frames(ros_client, "/robot1") >= frames + 3, 20, "frames after the bad input", [node_set]
        )
    finally:
        feed.stop()
    assert node_set.interrupt() == 0, node_set.output
    robot = json.loads(summary_path.read_text())["robots"]["/robot1"]
    assert robot["frames_failed"] == 0, node_set.output
    by_topic = robot["dropped_by_topic"]
    # ahead and old: the set's three messages; 1e300 x3 on the pose, NaN x3 on the gripper; the resized frame
    assert by_topic["/robot1/camera/exterior/image_raw"] >= 3, by_topic
    assert by_topic["/robot1/ee_pose"] >= 2 + 3 and by_topic["/robot1/gripper/joint_states"] >= 2 + 3, by_topic
    assert robot["dropped"] == sum(by_topic.values()) and robot["stamps_refused"] >= 6, robot
    out = node_set.output
    assert "ahead of this node's clock" in out and "ago, over max_observation_age_s" in out, out
    assert "/robot1/gripper/joint_states: gripper position nan" in out, out
    assert "/robot1/ee_pose: position x 1e+300" in out, out
    assert f"image is {2 * SIZE}x{2 * SIZE}, this camera's frames are {SIZE}x{SIZE}" in out, out
    # said once each, then counted (report_period_s 5): no line per bad message
    said = [line for line in node_set.lines if "1e+300" in line]
    assert 1 <= len(said) <= 2 and "more like this" not in said[0], out
    assert not any("ERROR" in line for line in node_set.lines), out


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_a_flood_of_bad_frames_shuts_that_camera_and_the_other_robot_keeps_planning(procs, ros_client, tmp_path):
    """400 bad frames a second on robot 2's camera: the topic is shut for a while (max_bad_rate_hz, as the
    pi0.5 node does), its problems are said throttled, and robot 1 keeps planning (issue 28.9)."""
    from diagnostic_msgs.msg import DiagnosticArray
    from std_msgs.msg import Float64

    from mstar_ros.bench.pi05_flood import Flooder

    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=200)
    ros_client.subscribe(Float64, "/robot1/plan/energy", depth=200)
    summary_path = tmp_path / "summary.json"
    (spec,) = vjepa2_processes(
        "/robot1 /robot2",
        extra_arguments=["--duration", "120", "--summary-json", str(summary_path)],
        ros_arguments=["-p", "plan_samples:=8", "-p", "plan_topk:=4"],
    )
    node_set = procs(*spec.command(python=sys.executable))
    feeds = [WorldModelFeed(ros_client, ns) for ns in ("/robot1", "/robot2")]
    for feed in feeds:
        feed.wait_for_node([node_set])
        feed.run(hz=8.0)
    flooder = Flooder(400.0, "/robot2/camera/exterior/image_raw")
    try:
        ros_client.wait_for(lambda: _frames(ros_client, "/robot1") >= 1, 60, "robot 1's first frame", [node_set])
        time.sleep(0.5)
        feeds[0].goal.publish(feeds[0].image(ros_client.node.get_clock().now().to_msg(), shade=7))
        ros_client.wait_for(lambda: len(ros_client.got("/robot1/plan/energy")) >= 2, 60, "robot 1's plans", [node_set])
        flooder.wait_for_subscriber(30)
        flooder.on.set()
        plans = len(ros_client.got("/robot1/plan/energy"))
        time.sleep(4.0)
        flooder.on.clear()
        ros_client.wait_for(
            lambda: len(ros_client.got("/robot1/plan/energy")) >= plans + 3,
            30,
            "robot 1 to plan on during robot 2's flood",
            [node_set],
        )
    finally:
        flooder.close()
        for feed in feeds:
            feed.stop()
    assert node_set.interrupt() == 0, node_set.output
    robots = json.loads(summary_path.read_text())["robots"]
    assert robots["/robot2"]["topics_shut"] >= 1, robots
    # cut within a quarter second of bad frames: far fewer received than the ~1600 sent
    assert robots["/robot2"]["dropped_by_topic"]["/robot2/camera/exterior/image_raw"] < 400, robots
    assert robots["/robot1"]["topics_shut"] == 0, robots
    rgba = [line for line in node_set.lines if "rgba8" in line]
    assert 1 <= len(rgba) <= 3, node_set.output
    assert "over max_bad_rate_hz=100 bad messages a second: unsubscribed for 5 s" in node_set.output


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_the_seed_parameter_reproduces_a_plan(procs, ros_client, tmp_path):
    """Three robots given the same frames, poses and goal: the two seeded 5 plan the same, the one seeded 6 plans
    otherwise (issue 28.19)."""
    from diagnostic_msgs.msg import DiagnosticArray
    from nav_msgs.msg import Path

    robots = ("/robot1", "/robot2", "/robot3")
    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=500)
    for ns in robots:
        ros_client.subscribe(Path, f"{ns}/plan/path", depth=20)
    params = tmp_path / "seeds.yaml"
    params.write_text(
        "".join(f"{ns}/world_model:\n  ros__parameters:\n    seed: {seed}\n" for ns, seed in zip(robots, (5, 5, 6)))
    )
    summary_path = tmp_path / "summary.json"
    (spec,) = vjepa2_processes(
        " ".join(robots),
        extra_arguments=["--duration", "120", "--summary-json", str(summary_path)],
        ros_arguments=[
            "-p",
            "fps:=100.0",
            "-p",
            "plan_samples:=8",
            "-p",
            "plan_topk:=4",
            "-p",
            "plan_iterations:=2",
            "-p",
            "max_pose_age_s:=2.0",
            "--params-file",
            str(params),
        ],
    )
    node_set = procs(*spec.command(python=sys.executable))
    feeds = [WorldModelFeed(ros_client, ns) for ns in robots]
    for feed in feeds:
        feed.wait_for_node([node_set])
    time.sleep(0.5)  # the subscriber's side of discovery completes a little after the publisher's

    def every(key: str, at_least: int) -> bool:
        return all(int(_robot_status(ros_client, ns).get(key, "0")) >= at_least for ns in robots)

    for feed in feeds:  # the same first frame
        feed.send(settle_s=0.5)
    ros_client.wait_for(lambda: every("frames", 1), 60, "each robot's first frame", [node_set])
    goal_stamp = ros_client.node.get_clock().now().to_msg()
    for feed in feeds:
        feed.goal.publish(feed.image(goal_stamp, shade=7))
    ros_client.wait_for(lambda: every("goals", 1), 60, "each robot's goal", [node_set])
    for feed in feeds:  # the same second frame: each robot plans once from it
        feed.send(x=0.52, settle_s=0.5)
    ros_client.wait_for(
        lambda: all(ros_client.got(f"{ns}/plan/path") for ns in robots), 60, "a plan per robot", [node_set]
    )
    assert node_set.interrupt() == 0, node_set.output

    def plan(ns: str) -> list[float]:
        (got,) = ros_client.got(f"{ns}/plan/path")
        return [v for p in got.msg.poses for v in (p.pose.position.x, p.pose.position.y, p.pose.position.z)]

    assert plan("/robot1") == pytest.approx(plan("/robot2"), abs=1e-5)
    assert plan("/robot1") != pytest.approx(plan("/robot3"), abs=1e-5)
    summary = json.loads(summary_path.read_text())["robots"]
    assert [summary[ns]["last_plan_seed"] for ns in robots] == [5, 5, 6], summary
