"""BAGEL as a ROS 2 node: questions about the camera's latest frame answered in text, and that frame edited by
an instruction into a goal image.

Subscribes in its namespace to

- ``camera_topic`` (sensor_msgs/Image, sensor-data QoS; rgb8, bgr8 or mono8): the newest good frame is kept
  (it replaces the one held; a camera flooding bad frames is unsubscribed for a while);
- ``question_topic`` (std_msgs/String): a question about that frame, answered on ``answer_topic``
  (std_msgs/String);
- ``edit_topic`` (std_msgs/String): an instruction (``the cup in the drawer``) that edits that frame; the
  edited image is published on ``goal_topic`` (sensor_msgs/Image rgb8, the source frame's size by default,
  its header's stamp and frame id): by default ``goal_image``, the topic the V-JEPA 2-AC world model of
  the same namespace plans toward.

The model is served by a Conductor (in this process, or in Worker processes per a placement), shared with
every other BAGEL node of the node set, so requests of all namespaces batch together. Requests run as
tasks on the asyncio loop: the ROS executor only checks and hands over, and never waits for the model.
Bad input -- an unsupported encoding, a step or data length that does not fit, a side over
``max_image_side``, an empty or too long text, no frame yet, a frame older than ``max_frame_age_s``,
more than ``max_pending`` questions (or edits) not done yet -- is logged as an error naming the topic and the field,
counted, and dropped; the node keeps serving. A failed request is logged and counted. Health on
/diagnostics once a second (``mstar: NS/bagel``).

Its callbacks are in bagel_inputs, its messages in bagel_outputs, its counters and /diagnostics in
bagel_status. This module imports rclpy: the node set imports it where ROS runs.
"""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
from rclpy.node import Node

from mstar.priority import Priority
from mstar.report_throttle import ReportThrottle
from mstar.request import RequestCancelled
from mstar_ros.ros.bagel.bagel_inputs import BagelInputs, HeldFrame
from mstar_ros.ros.bagel.bagel_outputs import BagelOutputs
from mstar_ros.ros.bagel.bagel_status import BagelStats, BagelStatus
from mstar_ros.ros.bagel.frame_checks import goal_pixels
from mstar_ros.ros.bagel.params import declare

__all__ = ["BagelNode"]


class BagelNode(BagelInputs, BagelOutputs, BagelStatus, Node):
    def __init__(self, model, conductor, loop: asyncio.AbstractEventLoop, namespace: str, name: str = "bagel") -> None:
        """``model``: mstar_graphs.bagel.frontend.BagelModel (or any model with its text and image methods)."""
        super().__init__(name, namespace=namespace)
        from mstar_graphs.bagel.requests import MAX_STEPS

        self.model, self.conductor, self.loop = model, conductor, loop
        self.params = p = declare(self, MAX_STEPS)
        self.stats = BagelStats()
        self.throttle = ReportThrottle(p.report_period_s)
        self._lock = threading.Lock()
        self._resolved = {
            t: self.resolve_topic_name(t)
            for t in (p.camera_topic, p.question_topic, p.answer_topic, p.edit_topic, p.goal_topic)
        }
        self.pending = 0  # requests in the runtime (changed on the asyncio loop only)
        self._tasks: set[asyncio.Task] = set()
        self._sequence = 0
        self.closing = False
        self._start_publishers(p)
        self._subscribe_inputs(p)
        self.create_timer(1.0, self._diagnose)

    # -- the runtime side (the asyncio loop) ------------------------------------------------
    def _start(self, kind: str, text: str, frame: HeldFrame) -> None:
        """Starts a request whose slot was taken on arrival (bagel_inputs); the slot is given back when it ends."""
        if self.closing:
            return self.slots.give_back(kind)
        self.pending += 1
        self._sequence += 1
        work = self._answer(text, frame, self._sequence) if kind == "ask" else self._edit(text, frame, self._sequence)
        task = self.loop.create_task(self._guarded(work, kind))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, work, kind: str) -> None:
        """Runs one request; a failure is logged and counted, and the node keeps serving."""
        try:
            await work
        except (RequestCancelled, asyncio.CancelledError):
            if not self.closing:
                self.get_logger().warning("a request was cancelled")
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.stats.failed += 1
                self.stats.last_error, self.stats.last_failure_at = text, time.monotonic()
            self.get_logger().error(f"request failed: {text}")
        finally:
            self.pending -= 1
            self.slots.give_back(kind)

    def _request_id(self, kind: str, n: int) -> str:
        return f"bagel:{self.get_namespace()}:{kind}-{n}"

    async def _answer(self, question: str, frame: HeldFrame, n: int) -> None:
        started = time.monotonic()
        model, p = self.model, self.params
        self.stats.questions += 1
        sampling = msgspec.structs.replace(
            model.default_sampling, max_tokens=p.max_answer_tokens, temperature=p.temperature
        )
        request = model.request(
            question,
            images=[frame.pixels],
            sampling=sampling,
            outputs=frozenset({model.text_output}),
            request_id=self._request_id("ask", n),
        )
        if p.priority:
            request.priority = Priority.parse(p.priority)  # else a question's own: interactive
        ids = [int(item.data) async for item in self.conductor.submit(request) if item.name == model.text_output]
        answer = model.decode_text(ids)
        self._publish_answer(answer)
        self.stats.answers += 1
        self.stats.answer_latencies_s.append(time.monotonic() - started)
        self.get_logger().info(f"answered {question[:60]!r} ({len(ids)} tokens): {answer[:80]!r}")

    async def _edit(self, instruction: str, frame: HeldFrame, n: int) -> None:
        started = time.monotonic()
        model, p = self.model, self.params
        self.stats.edits += 1
        height, width = frame.pixels.shape[:2]
        seed = p.seed if p.seed >= 0 else n
        edited = None
        events = model.generate_images(
            self.conductor,
            prompt=instruction,
            images=[frame.pixels],
            size=model.image_size(None, [(width, height)]),
            n=1,
            seed=seed,
            steps=p.edit_steps,
            request_id=self._request_id("edit", n),
            priority=p.priority or None,  # None: an edit's own class, batch
        )
        try:
            async for event in events:
                if event.kind == "final":
                    edited = event.image
        finally:
            await events.aclose()
        if edited is None:
            raise RuntimeError(f"the model made no image for {instruction!r}")
        pixels = goal_pixels(edited, (height, width) if p.match_frame_size else None)
        self._publish_goal(pixels, frame.stamp, frame.frame_id)
        self.stats.goals += 1
        self.stats.edit_latencies_s.append(time.monotonic() - started)
        self.get_logger().info(
            f"edited the frame by {instruction[:60]!r} (seed {seed}): goal image {pixels.shape[1]}x{pixels.shape[0]} "
            f"on {self._resolved[p.goal_topic]}"
        )

    def close(self) -> None:
        """Cancels the requests still running (call on the asyncio loop)."""
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
