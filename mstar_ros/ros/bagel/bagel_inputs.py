"""A BAGEL node's inputs: camera frames, questions and edit instructions, checked on arrival (a part of BagelNode).

Nothing a publisher sends can grow the node's memory or starve its answers:

- the newest good frame replaces the one held (latest_frame: frames never queue up); its pixels are converted
  once, when a request first uses it, and shared by every request about it;
- a camera flooding bad frames (over ``max_bad_rate_hz``) is unsubscribed for a while
  (mstar_ros.policy.flood_guard, mstar_ros.ros.common.sensor_subscriptions), so it costs nothing meanwhile;
- a question or an instruction takes one of its kind's ``max_pending`` slots (request_slots) before anything of
  it is made; with none free it is refused at once, on the executor thread: a flood of questions or edits holds
  at most ``max_pending`` requests each, and questions keep their own slots however many edits arrive.

A taken request is paired with the frame and handed to the runtime side on the asyncio loop; the executor thread
never waits for the model. A bad or refused message is logged as an error naming its topic and field (the same
problem once per ``report_period_s``, with a count), counted, and dropped. Questions and instructions are
commands: refused when busy, never unsubscribed.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import String

from mstar_ros.policy.flood_guard import FloodGuard
from mstar_ros.ros.bagel.frame_checks import check_frame, check_text
from mstar_ros.ros.bagel.latest_frame import LatestFrame
from mstar_ros.ros.bagel.params import BagelParams
from mstar_ros.ros.bagel.request_slots import RequestSlots
from mstar_ros.ros.common.convert import ObservationError, image_to_array
from mstar_ros.ros.common.sensor_subscriptions import SensorSubscriptions


@dataclass(frozen=True)
class HeldFrame:
    """The frame a request is about: RGB pixels and its header's stamp and frame id."""

    pixels: np.ndarray  # [H, W, 3] uint8, read-only (shared by the requests about this frame)
    stamp: object  # builtin_interfaces/Time
    frame_id: str


class BagelInputs:
    """BagelNode's ROS callbacks (the executor thread): check, keep, hand over."""

    def _subscribe_inputs(self, p: BagelParams) -> None:
        self.frame = LatestFrame()
        self.slots = RequestSlots(p.max_pending)
        self.flood_guard = FloodGuard(p.max_bad_rate_hz)
        self.sensors = SensorSubscriptions(
            self,
            {
                p.camera_topic: lambda: self.create_subscription(
                    Image, p.camera_topic, self._on_camera, qos_profile_sensor_data
                )
            },
            on_reopen=lambda topic: self.flood_guard.reopened(topic, time.monotonic()),
            closing=lambda: self.closing,
        )
        # reliable: a question or an instruction is a command, not a stream
        self.create_subscription(String, p.question_topic, self._on_question, 10)
        self.create_subscription(String, p.edit_topic, self._on_edit, 10)

    def _bad(self, topic: str, text: str, *, guard: bool = False) -> None:
        """A message or request refused: counted on its topic, logged as an error (throttled per topic and kind
        of problem: the text with its numbers left out) and, with ``guard`` (the camera's, on the executor
        thread), counted against the topic's flood limit."""
        now = time.monotonic()
        with self._lock:
            s = self.stats
            s.dropped += 1
            s.dropped_by_topic[self._resolved[topic]] += 1
            s.last_error, s.last_drop_at = text, now
            said = self.throttle.report(("bad", topic, re.sub(r"[-\d.]+", "#", text)), text, now)
        if said:
            self.get_logger().error(f"{said} (dropped)")
        hold = self.flood_guard.bad(topic, now) if guard else None
        if hold is not None and self.sensors.hold(topic, hold):
            with self._lock:
                self.stats.topics_shut += 1
            self.get_logger().error(
                f"{self._resolved[topic]}: over max_bad_rate_hz={self.flood_guard.max_bad_per_s:g} bad frames a "
                f"second: unsubscribed for {hold:g} s, then listening again"
            )

    def _on_camera(self, msg) -> None:
        p = self.params
        try:
            check_frame(msg, topic=self._resolved[p.camera_topic], max_side=p.max_image_side)
        except ObservationError as exc:
            return self._bad(p.camera_topic, str(exc), guard=True)
        self.frame.put(msg, time.monotonic())
        with self._lock:
            self.stats.frames += 1

    def _held_frame(self, topic: str) -> HeldFrame:
        """The newest frame as a request takes it, or ObservationError naming ``topic`` (the request's)."""
        p = self.params
        held = self.frame.held()
        camera = self._resolved[p.camera_topic]
        if held is None:
            raise ObservationError(f"{self._resolved[topic]}: no frame yet on {camera}")
        msg, arrived = held
        age = time.monotonic() - arrived
        if p.max_frame_age_s and age > p.max_frame_age_s:
            raise ObservationError(
                f"{self._resolved[topic]}: the newest frame on {camera} arrived {age:.1f} s ago "
                f"(max_frame_age_s {p.max_frame_age_s:g})"
            )
        return HeldFrame(self.frame.pixels(msg, image_to_array), msg.header.stamp, msg.header.frame_id)

    def _on_text(self, kind: str, topic: str, msg) -> None:
        what = "question" if kind == "ask" else "instruction"
        try:
            text = check_text(msg.data, topic=self._resolved[topic], what=what, max_chars=self.params.max_text_chars)
        except ObservationError as exc:
            return self._bad(topic, str(exc))
        if not self.slots.take(kind):  # before any pixel is converted or anything is queued
            with self._lock:
                self.stats.busy += 1
            return self._bad(
                topic,
                f"{self._resolved[topic]}: busy, {self.slots.limit} {what}s not done yet (max_pending "
                f"{self.params.max_pending})",
            )
        try:
            frame = self._held_frame(topic)
        except ObservationError as exc:
            self.slots.give_back(kind)
            return self._bad(topic, str(exc))
        self.loop.call_soon_threadsafe(self._start, kind, text, frame)

    def _on_question(self, msg) -> None:
        self._on_text("ask", self.params.question_topic, msg)

    def _on_edit(self, msg) -> None:
        self._on_text("edit", self.params.edit_topic, msg)
