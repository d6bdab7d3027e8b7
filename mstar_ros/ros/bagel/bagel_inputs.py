"""A BAGEL node's inputs: camera frames, questions and edit instructions, checked on arrival (a part of BagelNode).

The newest good frame is kept (its pixels are converted only when a request uses it). A question or an
instruction is checked, paired with that frame and handed to the runtime side on the asyncio loop; the
executor thread never waits for the model. A bad message is logged as an error naming its topic and field
(the same problem once per ``report_period_s``, with a count), counted, and dropped.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import String

from mstar_ros.ros.bagel.frame_checks import check_frame, check_text
from mstar_ros.ros.bagel.params import BagelParams
from mstar_ros.ros.common.convert import ObservationError, image_to_array


@dataclass(frozen=True)
class HeldFrame:
    """The frame a request is about: RGB pixels and its header's stamp and frame id."""

    pixels: np.ndarray  # [H, W, 3] uint8
    stamp: object  # builtin_interfaces/Time
    frame_id: str


class BagelInputs:
    """BagelNode's ROS callbacks (the executor thread): check, keep, hand over."""

    def _subscribe_inputs(self, p: BagelParams) -> None:
        self.create_subscription(Image, p.camera_topic, self._on_camera, qos_profile_sensor_data)
        # reliable: a question or an instruction is a command, not a stream
        self.create_subscription(String, p.question_topic, self._on_question, 10)
        self.create_subscription(String, p.edit_topic, self._on_edit, 10)

    def _bad(self, topic: str, text: str) -> None:
        """A message or request refused: counted on its topic, logged as an error (throttled per topic and kind
        of problem: the text with its numbers left out)."""
        now = time.monotonic()
        with self._lock:
            s = self.stats
            s.dropped += 1
            s.dropped_by_topic[self._resolved[topic]] += 1
            s.last_error, s.last_drop_at = text, now
            said = self.throttle.report(("bad", topic, re.sub(r"[-\d.]+", "#", text)), text, now)
        if said:
            self.get_logger().error(f"{said} (dropped)")

    def _on_camera(self, msg) -> None:
        p = self.params
        try:
            check_frame(msg, topic=self._resolved[p.camera_topic], max_side=p.max_image_side)
        except ObservationError as exc:
            return self._bad(p.camera_topic, str(exc))
        with self._lock:
            self._frame = (msg, time.monotonic())
            self.stats.frames += 1

    def _held_frame(self, topic: str) -> HeldFrame:
        """The newest frame as a request takes it, or ObservationError naming ``topic`` (the request's)."""
        p = self.params
        with self._lock:
            held = self._frame
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
        return HeldFrame(image_to_array(msg), msg.header.stamp, msg.header.frame_id)

    def _on_text(self, kind: str, topic: str, msg) -> None:
        what = "question" if kind == "ask" else "instruction"
        try:
            text = check_text(msg.data, topic=self._resolved[topic], what=what, max_chars=self.params.max_text_chars)
            frame = self._held_frame(topic)
        except ObservationError as exc:
            return self._bad(topic, str(exc))
        self.loop.call_soon_threadsafe(self._start, kind, text, frame)

    def _on_question(self, msg) -> None:
        self._on_text("ask", self.params.question_topic, msg)

    def _on_edit(self, msg) -> None:
        self._on_text("edit", self.params.edit_topic, msg)
