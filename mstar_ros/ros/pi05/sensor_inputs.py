"""The policy node's sensors: camera images and joint states, checked and kept (a part of PolicyNode).

Callbacks only check a message's header and keep it (its pixels are converted when a request
uses it); its stamp is judged by mstar_ros.policy.sensor_watch. A bad message is reported and
counted against its topic's flood limit (mstar_ros.policy.flood_guard): a flooding topic is
unsubscribed for a while (mstar_ros.ros.common.sensor_subscriptions).
"""

from __future__ import annotations

import re
import time

import numpy as np
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState

from mstar_ros.policy.flood_guard import FloodGuard
from mstar_ros.policy.freshness import FrameFreshness
from mstar_ros.policy.sensor_watch import SensorWatch
from mstar_ros.ros.common.convert import ObservationError, check_image, joint_positions, outside_limits, stamp_seconds
from mstar_ros.ros.common.sensor_subscriptions import SensorSubscriptions
from mstar_ros.ros.pi05.params import PolicyParams


class SensorInputs:
    """PolicyNode's sensor callbacks; the state they share lives on the node (set up here and in
    PolicyNode.__init__)."""

    def _start_sensor_inputs(self, p: PolicyParams) -> None:
        self._resolved: dict[str, str] = {}
        self.image_hw = (p.image_height, p.image_width)
        self.camera_topics = p.camera_topics  # checkpoint camera -> topic, model order
        self.cameras = list(self.camera_topics.values())
        self._joints_topic = p.joint_states_topic
        self.watch = SensorWatch(
            [self._full(t) for t in [*self.cameras, self._joints_topic]], p.max_observation_age_s, p.sensor_timeout_s
        )
        self.freshness = FrameFreshness() if p.wait_for_fresh_frames else None
        self.flood_guard = FloodGuard(p.max_bad_rate_hz)
        self._frames: dict[str, object] = {}  # camera topic -> the newest usable Image
        self._state: np.ndarray | None = None
        self._unstamped: set[str] = set()

    def _subscribe_sensors(self) -> None:
        def subscriber(msg_type, topic: str, callback):
            return lambda: self.create_subscription(msg_type, topic, callback, qos_profile_sensor_data)

        self.sensors = SensorSubscriptions(
            self,
            {
                **{t: subscriber(Image, t, lambda m, t=t: self._on_image(t, m)) for t in self.cameras},
                self._joints_topic: subscriber(JointState, self._joints_topic, self._on_joints),
            },
            on_reopen=lambda topic: self.flood_guard.reopened(topic, time.monotonic()),
            closing=lambda: self.closing,
        )

    def _bad(self, topic: str, text: str, *, level: str = "ERROR", count: str = "dropped") -> None:
        """A sensor message not acted on: reported (throttled per topic and kind of problem: the text with
        its numbers left out), and counted against the topic's flood limit."""
        self._problem(("bad", topic, re.sub(r"[-\d.]+", "#", text)), text, level, count=count)
        hold = self.flood_guard.bad(topic, time.monotonic())
        if hold is not None:
            self._shut(topic, hold)

    def _shut(self, topic: str, hold: float) -> None:
        """Unsubscribes a flooding topic (on the executor's thread, as every callback here) and listens
        again after ``hold`` seconds."""
        if not self.sensors.hold(topic, hold):
            return
        self.stats.topics_shut += 1
        self._say(
            f"{self._full(topic)}: over max_bad_rate_hz={self.flood_guard.max_bad_per_s:g} bad messages a "
            f"second: unsubscribed for {hold:g} s, then listening again",
            "ERROR",
        )

    def _full(self, topic: str) -> str:
        """The topic's resolved name (worked out once: this runs for every message)."""
        full = self._resolved.get(topic)
        if full is None:
            full = self._resolved[topic] = self.resolve_topic_name(topic)
        return full

    def _clock_now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _judge(self, topic: str, msg) -> bool:
        """Whether a checked message's stamp lets it be acted on (reported when not); records it."""
        full = self._full(topic)
        verdict = self.watch.check(full, stamp_seconds(msg), self._clock_now())
        if verdict.kind == "unstamped":
            if full not in self._unstamped:  # said once: such a sensor is judged by arrival alone
                self._unstamped.add(full)
                self._say(verdict.text, "WARN")
        elif not verdict.usable:  # counted against the flood limit too (a bag replayed at 400 Hz unstamped)
            self._bad(topic, verdict.text, level="WARN", count="stale_frames")
            return False
        return True

    def _on_image(self, topic: str, msg) -> None:
        try:
            check_image(msg, topic=self._full(topic), expect_hw=self.image_hw)
        except ObservationError as exc:
            return self._bad(topic, str(exc))
        if not self._judge(topic, msg):
            return
        now = time.monotonic()
        with self._lock:
            self.watch.accept(self._full(topic), stamp_seconds(msg), now)
            self._frames[topic] = msg
            if self.freshness is not None:
                self.freshness.arrived(topic, now)
            waiting = self._due_since is not None
        if waiting:  # the frame a due request waited for: send it now, not at the next tick
            self._tick()

    def _on_joints(self, msg) -> None:
        topic = self._full(self._joints_topic)
        try:
            state = joint_positions(msg, self.joint_names, topic=topic)
        except ObservationError as exc:
            return self._bad(self._joints_topic, str(exc))
        if not self._judge(self._joints_topic, msg):
            return
        out = outside_limits(self.joint_names, state, self.lower, self.upper)
        if out:  # reported, not clamped: the state is what the robot reports
            self._problem(
                ("limits", topic),
                f"{topic}: positions outside the joint limits: {', '.join(out)}",
                "WARN",
                count="states_outside_limits",
            )
        with self._lock:
            self.watch.accept(topic, stamp_seconds(msg), time.monotonic())
            self._state = state
