"""Fixtures for the ROS node-set tests: a short bag, processes with collected output, an rclpy test client.

Every test gets a ROS domain of its own (DDS shared memory crosses network namespaces,
so concurrent runs on one host would otherwise see each other) and localhost-only
discovery. The test client runs in the test process: its own rclpy context, spun by a thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mstar_ros.bag.ros_env import apply_localhost_defaults
from mstar_ros.bag.synthetic import SyntheticBagSpec, write_synthetic_bag
from support.ros_domain import next_domain

PY = sys.executable


@pytest.fixture(scope="session")
def short_bag(tmp_path_factory) -> Path:
    """Two robots, 8 s (played with --loop)."""
    path = tmp_path_factory.mktemp("ros_bags") / "droid_8s"
    write_synthetic_bag(path, SyntheticBagSpec(robots=2, seconds=8.0, seed=3))
    return path


@pytest.fixture
def ros_env(monkeypatch) -> dict[str, str]:
    domain = next_domain()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    for key in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "FASTDDS_DEFAULT_PROFILES_FILE", "RMW_IMPLEMENTATION"):
        monkeypatch.delenv(key, raising=False)
    apply_localhost_defaults()
    return {**os.environ}


class Proc:
    """A subprocess whose output lines are collected by a thread."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return f"$ {' '.join(self.cmd)}\n" + "\n".join(self.lines)

    def interrupt(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as a user stops it; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: takes its children too
            self.proc.wait(timeout=10)


@pytest.fixture
def procs(ros_env):
    made: list[Proc] = []

    def start(*cmd: str) -> Proc:
        p = Proc(list(cmd), ros_env)
        made.append(p)
        return p

    yield start
    for p in made:
        p.kill()


@dataclass
class Got:
    topic: str
    msg: object
    arrival: float


@dataclass
class RosClient:
    """Subscriptions and publishers in the test process."""

    domain_id: int
    received: list[Got] = field(default_factory=list)

    def __post_init__(self) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        self.context = Context()
        rclpy.init(args=[], context=self.context, domain_id=self.domain_id)
        self.node = rclpy.create_node("node_set_test_client", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def subscribe(self, msg_type, topic: str, depth: int = 100):
        def cb(msg) -> None:
            with self.lock:
                self.received.append(Got(topic, msg, time.monotonic()))

        return self.node.create_subscription(msg_type, topic, cb, depth)

    def publisher(self, msg_type, topic: str):
        return self.node.create_publisher(msg_type, topic, 10)

    def got(self, topic: str) -> list[Got]:
        with self.lock:
            return [g for g in self.received if g.topic == topic]

    def wait_for(self, predicate, timeout: float, what: str, procs: list[Proc] = ()) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            for p in procs:
                if p.proc.poll() is not None:
                    raise AssertionError(
                        f"a process exited ({p.proc.returncode}) while waiting for {what}:\n{p.output}"
                    )
            if time.monotonic() > deadline:
                logs = "\n\n".join(p.output for p in procs)
                raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def ros_client(ros_env):
    client = RosClient(int(ros_env["ROS_DOMAIN_ID"]))
    yield client
    client.close()


@pytest.fixture
def start_player(procs):
    """``mstar-ros bag play BAG --loop --restamp EXTRA...`` (it waits for a subscriber on every topic;
    restamped, as the policy nodes judge frames by header.stamp)."""

    def start(bag: Path, *extra: str) -> Proc:
        return procs(
            PY,
            "-m",
            "mstar_ros.cli",
            "bag",
            "play",
            str(bag),
            "--loop",
            "--restamp",
            "--progress",
            "0",
            "--wait-timeout",
            "60",
            *extra,
        )

    return start


class RobotFeed:
    """Publishes one robot's cameras (rgb8, at ``hz``) and joint states (at 2 x ``hz``) from a thread,
    stamped with the ROS clock unless ``stamp`` says otherwise: what a driver stack would send."""

    def __init__(
        self,
        client: RosClient,
        ns: str,
        cameras: list[str],
        joints: list[str],
        *,
        positions: list[float],
        hz: float = 15.0,
        image: bytes | None = None,
    ) -> None:
        from sensor_msgs.msg import Image, JointState

        self.client, self.hz = client, hz
        self.image_pubs = [client.publisher(Image, f"{ns}/{c}") for c in cameras]
        self.joint_pub = client.publisher(JointState, f"{ns}/joint_states")
        self.joints, self.positions = list(joints), list(positions)
        self.pixels = image if image is not None else bytes(range(256)) * (224 * 224 * 3 // 256)
        self.frozen_stamp = None  # set: cameras repeat this stamp (a frozen driver)
        self.paused = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> RobotFeed:
        self.client.wait_for(
            lambda: all(p.get_subscription_count() > 0 for p in self.image_pubs + [self.joint_pub]),
            60,
            "the policy node's subscriptions",
        )
        self.thread.start()
        return self

    def _run(self) -> None:
        from sensor_msgs.msg import Image, JointState

        k = 0
        while not self._stop.is_set():
            if not self.paused.is_set():
                now = self.client.node.get_clock().now().to_msg()
                js = JointState(name=self.joints, position=[float(x) for x in self.positions])
                js.header.stamp = now
                self.joint_pub.publish(js)
                if k % 2 == 0:
                    for pub in self.image_pubs:
                        img = Image(encoding="rgb8", width=224, height=224, step=224 * 3)
                        img.header.stamp = self.frozen_stamp or now
                        img.data = self.pixels
                        pub.publish(img)
            k += 1
            time.sleep(0.5 / self.hz)

    def close(self) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)


@pytest.fixture
def robot_feed(ros_client):
    feeds: list[RobotFeed] = []

    def make(*args, **kwargs) -> RobotFeed:
        feed = RobotFeed(ros_client, *args, **kwargs)
        feeds.append(feed)
        return feed

    yield make
    for feed in feeds:
        feed.close()
