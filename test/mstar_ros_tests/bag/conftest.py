"""Fixtures for the bag tests: small synthetic bags, a ROS environment per test, a test subscriber."""

from __future__ import annotations

import hashlib
import os
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

CLI = [sys.executable, "-m", "mstar_ros.cli"]


@pytest.fixture(scope="session")
def small_bag(tmp_path_factory) -> tuple[Path, SyntheticBagSpec]:
    """Two robots, 3 s, default 224 x 224 rgb8 images: 360 messages."""
    spec = SyntheticBagSpec(robots=2, seconds=3.0, seed=7)
    path = tmp_path_factory.mktemp("bags") / "droid_small"
    write_synthetic_bag(path, spec)
    return path, spec


@pytest.fixture
def ros_env(monkeypatch) -> dict[str, str]:
    """Localhost-only discovery, the Fast DDS profile, and a domain of our own.

    The domain keeps concurrent test runs on one host (DDS shared memory crosses
    network namespaces) from seeing each other's topics.
    """
    domain = next_domain()
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    for key in ("ROS_AUTOMATIC_DISCOVERY_RANGE", "FASTDDS_DEFAULT_PROFILES_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("RMW_IMPLEMENTATION", raising=False)
    apply_localhost_defaults()  # the same defaults the player applies to itself
    return {**os.environ}


@dataclass
class Received:
    topic: str
    stamp_ns: int
    arrival: float  # time.monotonic()
    digest: str  # sha1 of the image bytes or of the joint positions
    frame_id: str


@dataclass
class RosSubscriber:
    """rclpy subscriptions in this process, spun by a background thread."""

    topics: dict[str, str]  # topic -> "image" | "joints"
    domain_id: int
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, qos_profile_sensor_data
        from sensor_msgs.msg import Image, JointState

        self.context = Context()
        rclpy.init(context=self.context, domain_id=self.domain_id)
        self.node = rclpy.create_node("bag_test_subscriber", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.lock = threading.Lock()
        for topic, kind in self.topics.items():
            if kind == "image":  # as the policy nodes subscribe to cameras: sensor-data QoS (best effort)
                self.node.create_subscription(Image, topic, self._callback(topic, True), qos_profile_sensor_data)
            else:
                self.node.create_subscription(JointState, topic, self._callback(topic, False), QoSProfile(depth=100))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _callback(self, topic: str, image: bool):
        def cb(msg) -> None:
            now = time.monotonic()
            raw = bytes(msg.data) if image else repr([round(x, 12) for x in msg.position]).encode()
            rec = Received(
                topic,
                msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec,
                now,
                hashlib.sha1(raw).hexdigest(),
                msg.header.frame_id,
            )
            with self.lock:
                self.received.append(rec)

        return cb

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def by_topic(self) -> dict[str, list[Received]]:
        out: dict[str, list[Received]] = {t: [] for t in self.topics}
        with self.lock:
            for r in self.received:
                out[r.topic].append(r)
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def subscriber_factory(ros_env):
    made: list[RosSubscriber] = []

    def make(topics: dict[str, str]) -> RosSubscriber:
        sub = RosSubscriber(topics, int(ros_env["ROS_DOMAIN_ID"]))
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.close()


class PlayerProcess:
    """``mstar-ros bag play`` in a subprocess; its output lines collected by a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [*CLI, "bag", "play", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for_line(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hit = next((line for line in self.lines if text in line), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"player never printed {text!r}; output:\n{self.output}")
                self._cond.wait(min(left, 0.1))

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return rc

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def player_factory(ros_env):
    made: list[PlayerProcess] = []

    def make(*args: str) -> PlayerProcess:
        p = PlayerProcess(list(args), ros_env)
        made.append(p)
        return p

    yield make
    for p in made:
        p.kill()
