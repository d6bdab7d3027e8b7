"""One robot's pi0.5 policy as a ROS 2 node: cameras + joint states in, JointTrajectory chunks out.

Subscribes (in its namespace, sensor-data QoS) to ``camera topics`` (sensor_msgs/Image,
rgb8 / bgr8 / mono8) and ``joint_states``; takes the task from the ``prompt``
parameter and the ``prompt`` topic (std_msgs/String). At the control rate it checks
its action queue (mstar_ros.policy.chunking) and, when the queue runs low, submits
the latest observation to the runtime (waiting for the next camera frame when the newest
is past half its period: mstar_ros.policy.freshness); the chunk comes back as
trajectory_msgs/JointTrajectory on ``action_chunk`` (one point per control tick).
Several robots' requests are batched by the runtime, not here. A bad message is
reported on /diagnostics with what is wrong, dropped, and nothing else stops.

Callbacks only check a message's header and keep it; its pixels are converted (with
numpy) when a request uses it, so the ROS side costs the model as little CPU and GIL
time as it can (they share a process). Each chunk skips the actions whose time passed
while it was computed: its points start at ``header.stamp``, spaced 1 / rate.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mstar.conductor import Conductor
from mstar.conductor.request import RequestCancelled
from mstar_ros.policy.admission import ChunkAdmission
from mstar_ros.policy.chunking import ActionChunker
from mstar_ros.policy.freshness import FrameFreshness
from mstar_ros.ros.convert import (ObservationError, check_image, denormalize_actions, image_to_array,
                                   joint_positions, normalize_state, trajectory_msg)
from mstar_ros.ros.diagnostics import publish_status

log = logging.getLogger("mstar_ros.policy")

PARAMETERS = {  # name: (default, description)
    "cameras": (["camera/exterior/image_raw", "camera/wrist/image_raw"], "camera topics, in the model's camera order"),
    "joint_states_topic": ("joint_states", "sensor_msgs/JointState topic"),
    "joint_names": ([f"panda_joint{i}" for i in range(1, 8)] + ["robotiq_85_left_knuckle_joint"],
                    "joints the policy reads and commands, in the action order"),
    "joint_lower": ([-2.9, -1.8, -2.9, -3.1, -2.9, -0.1, -2.9, 0.0], "lower joint limits (state/action scaling)"),
    "joint_upper": ([2.9, 1.8, 2.9, 0.0, 2.9, 3.8, 2.9, 0.8], "upper joint limits (state/action scaling)"),
    "prompt": ("pick up the object", "the task, in words (also settable on the 'prompt' topic)"),
    "control_rate_hz": (15.0, "actions per second the robot executes (JointTrajectory point spacing)"),
    "refill_at": (0, "request the next chunk when this many actions are left (0: half the horizon)"),
    "smooth": (True, "real-time chunking: inpaint the actions that run while a chunk is computed"),
    "image_height": (224, "expected camera image height (other sizes are reported and dropped)"),
    "image_width": (224, "expected camera image width"),
    "max_observation_age_s": (0.5, "do not act on camera or joint data older than this (a sensor stopped)"),
    "wait_for_fresh_frames": (True, "when a chunk falls due late in a camera frame's life, wait (at most one "
                                    "frame period) for the next frame: a fresher observation for less wait"),
}


@dataclass
class _Outgoing:
    request: object   # the runtime request (mstar.conductor.request.Request)
    oldest: float     # arrival (time.monotonic()) of the oldest sensor frame it uses


@dataclass
class RobotStats:
    chunks: int = 0
    dropped: int = 0
    latencies_s: list[float] = field(default_factory=list)  # oldest sensor frame used -> chunk published
    last_error: str = ""
    fresh_waits: int = 0      # requests that waited for a fresher camera frame (wait_for_fresh_frames)
    admission_waits: int = 0  # requests that waited for an in-flight slot (the node set's --max-inflight)
    first_request: float | None = None  # time.monotonic() of the first request (data started flowing)


def make_policy_node(policy, conductor: Conductor, loop: asyncio.AbstractEventLoop, namespace: str,
                     overrides: dict | None = None, admission: ChunkAdmission | None = None):
    """Builds the node (rclpy must be initialised). ``overrides`` replace parameter defaults
    (a params file or ``-p`` still wins, as for any declared parameter); ``admission`` is the
    node set's in-flight limit, shared by its robots (default: none)."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rcl_interfaces.msg import SetParametersResult
    from rclpy.node import Node
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    class PolicyNode(Node):
        def __init__(self) -> None:
            super().__init__("pi05_policy", namespace=namespace)
            defaults = dict(PARAMETERS)
            for key, value in (overrides or {}).items():
                defaults[key] = (value, defaults[key][1])
            for name, (default, _) in defaults.items():
                self.declare_parameter(name, default)
            p = {name: self.get_parameter(name).value for name in PARAMETERS}
            where = self.get_fully_qualified_name()
            self.joint_names = list(p["joint_names"])
            self.lower, self.upper = list(p["joint_lower"]), list(p["joint_upper"])
            if not len(self.joint_names) == len(self.lower) == len(self.upper):
                raise ValueError(f"{where}: joint_names, joint_lower and joint_upper differ in length")
            if len(self.joint_names) > policy.action_dim:
                raise ValueError(f"{where}: {len(self.joint_names)} joints but the model acts in {policy.action_dim} dims")
            self.prompt = str(p["prompt"]).strip()
            if not self.prompt:
                raise ValueError(f"{where}: parameter 'prompt' is empty")
            self.rate = float(p["control_rate_hz"])
            if not self.rate > 0:
                raise ValueError(f"{where}: control_rate_hz must be > 0, got {self.rate}")
            self.image_hw = (int(p["image_height"]), int(p["image_width"]))
            self.cameras = list(p["cameras"])
            self.max_age = float(p["max_observation_age_s"])
            self.freshness = FrameFreshness() if bool(p["wait_for_fresh_frames"]) else None
            self.admission = admission or ChunkAdmission()
            self._due_since: float | None = None    # the pending request fell due then
            self._admitted_at: float | None = None  # ... and was admitted then (holds an in-flight slot)
            self.chunker = ActionChunker(policy.action_horizon, policy.action_dim, self.rate,
                                         refill_at=int(p["refill_at"]) or None, smooth=bool(p["smooth"]))
            self.stats = RobotStats()
            self.closing = False  # set before the node is destroyed: late chunks are dropped quietly
            self._stale_reported = False
            self._lock = threading.Lock()
            self._frames: dict[str, tuple[object, float]] = {}  # camera topic -> (checked Image, arrival)
            self._state: tuple[np.ndarray, float] | None = None
            self._busy = False
            self._n = 0
            for topic in self.cameras:
                self.create_subscription(Image, topic, lambda m, t=topic: self._on_image(t, m), qos_profile_sensor_data)
            self.create_subscription(JointState, str(p["joint_states_topic"]), self._on_joints, qos_profile_sensor_data)
            self.create_subscription(String, "prompt", self._on_prompt, 10)
            self.add_on_set_parameters_callback(self._on_set_parameters)
            self.actions_pub = self.create_publisher(JointTrajectory, "action_chunk", 10)
            self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.create_timer(1.0 / self.rate, self._tick)

        # -- inputs --------------------------------------------------------------------
        def _full(self, topic: str) -> str:
            return self.resolve_topic_name(topic)

        def _on_image(self, topic: str, msg) -> None:
            try:
                check_image(msg, topic=self._full(topic), expect_hw=self.image_hw)
            except ObservationError as exc:
                return self._report(str(exc))
            now = time.monotonic()
            with self._lock:
                self._frames[topic] = (msg, now)
                if self.freshness is not None:
                    self.freshness.arrived(topic, now)
                waiting = self._due_since is not None
            if waiting:  # the frame a due request waited for: send it now, not at the next tick
                self._tick()

        def _on_joints(self, msg) -> None:
            try:
                state = joint_positions(msg, self.joint_names, topic=self._full("joint_states"))
            except ObservationError as exc:
                return self._report(str(exc))
            with self._lock:
                self._state = (state, time.monotonic())

        def _on_prompt(self, msg) -> None:
            if not msg.data.strip():
                return self._report(f"{self._full('prompt')}: empty prompt ignored (keeping {self.prompt!r})")
            self.prompt = msg.data.strip()

        def _on_set_parameters(self, params) -> SetParametersResult:
            for param in params:
                if param.name == "prompt":
                    if not str(param.value).strip():
                        return SetParametersResult(successful=False, reason="the prompt must not be empty")
                    self.prompt = str(param.value).strip()
            return SetParametersResult(successful=True)

        # -- the control loop ------------------------------------------------------------
        def _oldest_arrival(self) -> float:
            """When the oldest of the frames and the joint state a request would use arrived."""
            return min([self._frames[t][1] for t in self.cameras] + [self._state[1]])

        def _due_and_fed(self, now: float) -> bool:
            """A chunk is due and every sensor has given recent data (called under the lock)."""
            if self.closing or self._busy or not self.chunker.needs_request(now):
                return False
            if self._state is None or any(t not in self._frames for t in self.cameras):
                return False  # waiting for every camera and the joint state
            oldest = self._oldest_arrival()
            if now - oldest > self.max_age:  # a sensor went quiet: acting on old data is worse than waiting
                if not self._stale_reported:
                    self._stale_reported = True
                    self._report(f"{self.get_namespace()}: sensor data is {now - oldest:.1f} s old; waiting",
                                 dropped=False)
                return False
            self._stale_reported = False
            return True

        def _tick(self) -> None:
            """At the control rate, on a frame a due request waits for, and when another robot's
            chunk frees an admission slot: sends the request once it is due, admitted and fresh."""
            now = time.monotonic()
            request, refused, give_back, withdraw = None, None, False, False
            with self._lock:
                if self._due_and_fed(now):
                    request, refused = self._admitted_request(now)
                elif self._due_since is not None:  # it was due, but its sensors went quiet (or it closes):
                    give_back, withdraw = self._admitted_at is not None, self._admitted_at is None
                    self._due_since, self._admitted_at = None, None  # others need not wait for it
            if give_back or refused is not None:
                self.admission.release()
            if withdraw:
                self.admission.withdraw(self.get_namespace())
            if refused is not None:
                return self._report(f"{self.get_namespace()}: observation refused: {refused}")
            if request is not None:
                oldest = request.oldest
                future = asyncio.run_coroutine_threadsafe(_serve(conductor, request.request), loop)
                future.add_done_callback(lambda f: self._on_chunk(f, oldest))

        def _admitted_request(self, now: float) -> tuple[_Outgoing | None, ValueError | None]:
            """Under the lock, a request being due: (the request to send, or None while it waits
            for an admission slot or a fresher frame; the reason the observation was refused)."""
            self._due_since = now if self._due_since is None else self._due_since
            if self._admitted_at is None:
                if not self.admission.try_acquire(self.get_namespace(), self._due_since, self._tick):
                    return None, None  # other robots' chunks fill the node set's in-flight limit
                self._admitted_at = now
            if self.freshness is not None and self.freshness.should_wait(now, self._admitted_at):
                return None, None
            self.stats.admission_waits += self._admitted_at > self._due_since
            self.stats.fresh_waits += now > self._admitted_at
            self._due_since = None
            oldest = self._oldest_arrival()
            images = torch.from_numpy(np.stack([image_to_array(self._frames[t][0]) for t in self.cameras]))
            state = normalize_state(torch.from_numpy(self._state[0]), self.lower, self.upper)
            try:
                guide, weights = self.chunker.begin_request(now)
                self._n += 1
                request = policy.request(images, state, self.prompt, seed=self._n, guide=guide,
                                         guide_weights=weights,
                                         request_id=f"{self.get_namespace().strip('/') or 'robot'}-{self._n}")
            except ValueError as exc:
                self.chunker.pending, self._admitted_at = None, None
                return None, exc
            self._busy = True
            if self.stats.first_request is None:
                self.stats.first_request = now
            return _Outgoing(request, oldest), None

        def _on_chunk(self, future, oldest: float) -> None:
            """On the Conductor's loop thread (rclpy publishers are thread-safe)."""
            try:
                self._deliver(future, oldest)
            finally:  # outside the node's lock: the freed slot may start another robot's request
                self.admission.release()

        def _deliver(self, future, oldest: float) -> None:
            now = time.monotonic()
            try:
                (chunk,) = future.result()["actions"]
            except Exception as exc:
                with self._lock:
                    self._busy, self.chunker.pending, self._admitted_at = False, None, None
                if not self.closing and not isinstance(exc, (RequestCancelled, asyncio.CancelledError)):
                    self._report(f"{self.get_namespace()}: chunk failed: {exc}")
                return
            with self._lock:
                start_tick, actions = self.chunker.accept(chunk, now)
                self._busy, self._admitted_at = False, None
                start_in = self.chunker.time_of(start_tick) - now
                if self.closing:
                    return
                stamp = (self.get_clock().now() + _duration(max(0.0, start_in))).to_msg()
                positions = denormalize_actions(actions, self.lower, self.upper)
                self.actions_pub.publish(trajectory_msg(self.joint_names, positions, self.rate, stamp))
                self.stats.chunks += 1
                self.stats.latencies_s.append(time.monotonic() - oldest)

        def _report(self, text: str, *, dropped: bool = True) -> None:
            if self.closing:
                return
            self.stats.dropped += int(dropped)
            self.stats.last_error = text
            self.get_logger().warning(text)
            publish_status(self, self.diag_pub, f"mstar: {self.get_fully_qualified_name()}", text,
                           self.get_namespace(), {"dropped": self.stats.dropped, "chunks": self.stats.chunks},
                           level="ERROR" if dropped else "WARN")

    return PolicyNode()


async def _serve(conductor: Conductor, request) -> dict:
    """On the Conductor's loop: submit() starts tasks, so it must run there, not on an rclpy thread."""
    return await conductor.submit(request).collect()


def _duration(seconds: float):
    from rclpy.duration import Duration
    return Duration(seconds=math.floor(seconds), nanoseconds=int((seconds - math.floor(seconds)) * 1e9))
