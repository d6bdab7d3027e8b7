"""One robot's pi0.5 policy as a ROS 2 node: cameras + joint states in, JointTrajectory chunks out.

Subscribes (in its namespace, sensor-data QoS) to one camera topic per camera of the
checkpoint (``cameras.<name>``; sensor_msgs/Image, rgb8 / bgr8 / mono8) and to the joint
states; takes the task from the ``prompt`` parameter and the ``prompt`` topic
(std_msgs/String, capped in bytes and tokens, tokenized once when it changes). At the
control rate it checks its action queue (mstar_ros.policy.chunking) and, when the queue runs
low, submits the latest observation to the runtime: the state normalised with the
checkpoint's own statistics (or, for a checkpoint without any, the joint limits), the chunk
unnormalised with the action statistics. The chunk comes back on ``action_chunk`` (one action per
control tick), as ``action_space`` says (mstar_ros.ros.pi05.action_output): a
trajectory_msgs/JointTrajectory of joint positions (the default) or velocities, or a labelled
std_msgs/Float32MultiArray. Several robots' requests are batched by the runtime, not here.

Safety: data is judged by ``header.stamp`` as well as arrival (mstar_ros.policy.sensor_watch):
a stale, future-stamped or frozen-stamp frame is not acted on; when a sensor gives nothing
fresh for ``sensor_timeout_s`` the node publishes an empty JointTrajectory (controllers stop
and hold; ``on_sensor_loss: hold``), drops what was in flight, and says ERROR on /diagnostics
until observations and chunks resume (then OK). When the policy cannot produce chunks (a
Worker down, a chunk overdue by ``chunk_timeout_s`` or failed: mstar_ros.policy.chunk_watch)
the robot holds and says ERROR the same way, until a chunk is published again; an overdue
chunk is cancelled in the runtime. A bad message is reported (the same problem
once per ``report_period_s`` with a count: mstar.report_throttle), dropped, and
nothing else stops. Positions outside the joint limits are reported, never clamped.

Callbacks only check a message's header and keep it; its pixels are converted (with numpy)
when a request uses it, so the ROS side costs the model as little CPU and GIL time as it can
(they share a process). Each chunk skips the actions whose time passed while it was computed:
its points start at ``header.stamp``, spaced 1 / rate.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from mstar.conductor import Conductor
from mstar.conductor.request import RequestCancelled, UnknownRequest
from mstar.report_throttle import ReportThrottle
from mstar_graphs.pi05.prompt import PromptError
from mstar_ros.policy.admission import ChunkAdmission
from mstar_ros.policy.chunk_watch import ChunkWatch
from mstar_ros.policy.chunking import ActionChunker
from mstar_ros.policy.flood_guard import FloodGuard
from mstar_ros.policy.freshness import FrameFreshness
from mstar_ros.policy.sensor_watch import SensorWatch
from mstar_ros.ros.pi05.action_output import ActionOutput
from mstar_ros.ros.common.convert import (ObservationError, check_image, image_to_array, joint_positions, outside_limits,
                                   stamp_seconds)
from mstar_ros.ros.common.diagnostics import publish_status
from mstar_ros.ros.pi05.params_fit import check_fits
from mstar_ros.ros.pi05.params import PARAMETERS, declare
from mstar_ros.ros.pi05.robot_stats import RobotStats
from mstar_ros.ros.common.worker_health import first_down

log = logging.getLogger("mstar_ros.policy")

__all__ = ["PARAMETERS", "RobotStats", "make_policy_node"]


@dataclass
class _Outgoing:
    request: object   # the runtime request (mstar.conductor.request.Request)
    oldest: float     # arrival (time.monotonic()) of the oldest sensor frame it uses
    epoch: int        # the node's sensor-loss epoch when it was sent: a later loss discards it


def make_policy_node(policy, conductor: Conductor, loop: asyncio.AbstractEventLoop, namespace: str,
                     overrides: dict | None = None, admission: ChunkAdmission | None = None):
    """Builds the node (rclpy must be initialised). ``overrides`` replace parameter defaults
    (a params file or ``-p`` still wins, as for any declared parameter); ``admission`` is the
    node set's in-flight limit, shared by its robots (default: none). ValueError (naming the
    parameter) when the parameters do not fit the checkpoint."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rcl_interfaces.msg import SetParametersResult
    from rclpy.node import Node
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String

    class PolicyNode(Node):
        def __init__(self) -> None:
            super().__init__("pi05_policy", namespace=namespace)
            where = self.get_fully_qualified_name()
            self._resolved: dict[str, str] = {}
            p = self.params = declare(self, policy.cameras, policy.layout.placeholder_cameras, overrides)
            self.joint_names, self.action_names = list(p.joint_names), p.actions
            check_fits(p, policy, where)
            self.robot_dims = len(self.action_names)  # the first of the model's action dims (the checkpoint's)
            try:
                self.normalization = policy.normalization(p.joint_lower, p.joint_upper)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            self.lower, self.upper = list(p.joint_lower), list(p.joint_upper)
            self.token_cap = p.max_prompt_tokens or None
            budget = policy.layout.config.max_token_len
            if self.token_cap is not None and self.token_cap > budget:
                raise ValueError(f"{where}: parameter max_prompt_tokens: {self.token_cap} is over the checkpoint's "
                                 f"tokenizer_max_length={budget} (a prompt that long leaves no room for the state)")
            try:
                self.task = policy.task(p.prompt, max_tokens=self.token_cap)
            except PromptError as exc:
                raise ValueError(f"{where}: parameter prompt: {exc}") from None
            self.prompt = self.task.text
            self.rate = p.control_rate_hz
            self.image_hw = (p.image_height, p.image_width)
            self.camera_topics = p.camera_topics              # checkpoint camera -> topic, model order
            self.cameras = list(self.camera_topics.values())
            self._joints_topic = p.joint_states_topic
            self.watch = SensorWatch([self._full(t) for t in [*self.cameras, self._joints_topic]],
                                     p.max_observation_age_s, p.sensor_timeout_s)
            self.hold_on_loss = p.on_sensor_loss == "hold"
            self.freshness = FrameFreshness() if p.wait_for_fresh_frames else None
            self.admission = admission or ChunkAdmission()
            self.throttle = ReportThrottle(p.report_period_s)
            self._due_since: float | None = None    # the pending request fell due then
            self._admitted_at: float | None = None  # ... and was admitted then (holds an in-flight slot)
            self.chunker = ActionChunker(policy.action_horizon, policy.action_dim, self.rate,
                                         refill_at=p.refill_at or None, smooth=p.smooth)
            # by default one chunk's duration: a chunk later than that has every action in the past
            self.chunk_watch = ChunkWatch(p.chunk_timeout_s or policy.action_horizon / self.rate)
            self._action_limits = self._limits_of_actions(p.action_space)
            self._inflight_id: str | None = None  # the runtime request in flight (cancelled when overdue)
            self.stats = RobotStats()
            self.closing = False  # set before the node is destroyed: late chunks are dropped quietly
            self._lock = threading.Lock()
            self._frames: dict[str, object] = {}    # camera topic -> the newest usable Image
            self._state: np.ndarray | None = None
            self._busy = False
            self._n = 0
            self._epoch = 0                   # bumped by each sensor loss
            self._lost_now = False            # the data is lost at this moment (sensor_timeout_s passed)
            self._loss_since: float | None = None  # in a sensor loss since (monotonic), until chunks resume
            self._loss_text = ""
            self._truncation_said = False
            self._unstamped: set[str] = set()
            self._levels: dict[object, str] = {}  # throttled problem -> its level (for the repeats' report)
            self._report_lock = threading.Lock()  # the throttle and the counters, from both threads
            self.flood_guard = FloodGuard(p.max_bad_rate_hz)
            self._sensor_types = {**{t: (Image, lambda m, t=t: self._on_image(t, m)) for t in self.cameras},
                                  self._joints_topic: (JointState, self._on_joints)}
            self._sensor_subs = {topic: self._subscribe(topic) for topic in self._sensor_types}
            self.create_subscription(String, "prompt", self._on_prompt, 10)
            self.add_on_set_parameters_callback(self._on_set_parameters)
            self.output = ActionOutput(self, p.action_space, self.action_names, self.rate)
            self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.create_timer(1.0 / self.rate, self._tick)
            self.create_timer(1.0, self._publish_status)
            self.get_logger().info(
                f"cameras {', '.join(f'{n} <- {self._full(t)}' for n, t in self.camera_topics.items())}"
                + "".join(f"; {n}: none (left out, as the references mask a missing camera)"
                          for n, t in p.cameras.items() if not t)
                + f"; normalisation: {self.normalization.describe()}"
                + f"; actions: {p.action_space} {', '.join(self.action_names)} ({self.output.type_name})")

        def _limits_of_actions(self, space: str) -> tuple[list[int], list[str], list[float], list[float]] | None:
            """(columns, names, lower, upper) of the actions that are positions of joints with limits, or None."""
            if space != "joint_positions" or not self.lower:
                return None
            cols = [i for i, n in enumerate(self.action_names) if n in self.joint_names]
            joints = [self.joint_names.index(self.action_names[i]) for i in cols]
            return (cols, [self.action_names[i] for i in cols], [self.lower[j] for j in joints],
                    [self.upper[j] for j in joints])

        # -- inputs --------------------------------------------------------------------
        def _subscribe(self, topic: str):
            msg_type, callback = self._sensor_types[topic]
            return self.create_subscription(msg_type, topic, callback, qos_profile_sensor_data)

        def _bad(self, topic: str, text: str, *, level: str = "ERROR", count: str = "dropped") -> None:
            """A sensor message not acted on: reported (throttled per topic and kind of problem: the text with
            its numbers left out), and counted against the topic's flood limit."""
            self._problem(("bad", topic, re.sub(r"[-\d.]+", "#", text)), text, level, count=count)
            hold = self.flood_guard.bad(topic, time.monotonic())
            if hold is not None:
                self._shut(topic, hold)

        def _shut(self, topic: str, hold: float) -> None:
            """Unsubscribes a flooding topic (on the executor's thread, as every callback here) and listens
            again after ``hold`` seconds (a one-shot timer)."""
            sub = self._sensor_subs.pop(topic, None)
            if sub is None:
                return
            self.destroy_subscription(sub)
            self.stats.topics_shut += 1
            self._say(f"{self._full(topic)}: over max_bad_rate_hz={self.flood_guard.max_bad_per_s:g} bad messages a "
                      f"second: unsubscribed for {hold:g} s, then listening again", "ERROR")
            timer = []

            def reopen() -> None:
                self.destroy_timer(timer[0])
                self.flood_guard.reopened(topic, time.monotonic())
                if not self.closing and topic not in self._sensor_subs:
                    self._sensor_subs[topic] = self._subscribe(topic)

            timer.append(self.create_timer(hold, reopen))

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
                self._problem(("limits", topic), f"{topic}: positions outside the joint limits: {', '.join(out)}",
                              "WARN", count="states_outside_limits")
            with self._lock:
                self.watch.accept(topic, stamp_seconds(msg), time.monotonic())
                self._state = state

        def _on_prompt(self, msg) -> None:
            self._set_prompt(msg.data, self._full("prompt"))

        def _set_prompt(self, text: str, source: str) -> str | None:
            """Takes a new task (tokenized here, once, off every lock); the reason it was refused, or None."""
            cap = self.params.max_prompt_bytes
            if len(text) > cap or len(text.encode("utf-8", "replace")) > cap:  # chars first: no 1 MB encode
                why = f"prompt refused: over max_prompt_bytes={cap}"
            else:
                try:
                    task = policy.task(text, max_tokens=self.token_cap)
                except PromptError as exc:
                    why = "empty prompt ignored" if not text.strip() else f"prompt refused: {exc}"
                else:
                    with self._lock:
                        self.task, self.prompt, self._truncation_said = task, task.text, False
                    return None
            self._problem(("prompt", source), f"{source}: {why} (keeping {self.prompt!r})", "ERROR",
                          count="prompts_refused")
            return why

        def _on_set_parameters(self, params) -> SetParametersResult:
            """Only the prompt changes while serving; the others are read at start (refused, not ignored)."""
            fixed = [p.name for p in params if p.name != "prompt"]
            if fixed:
                return SetParametersResult(successful=False, reason=f"{', '.join(fixed)}: read at start; restart the "
                                                                    "node set to change it")
            for param in params:
                why = self._set_prompt(str(param.value), f"{self.get_fully_qualified_name()} parameter prompt")
                if why is not None:
                    return SetParametersResult(successful=False, reason=why)
            return SetParametersResult(successful=True)

        # -- the control loop ------------------------------------------------------------
        def _due_and_fed(self, now: float, worker_down: str | None) -> bool:
            """A chunk is due, the Workers are up and every sensor has given recent data (under the lock)."""
            if self.closing or self._busy or worker_down is not None or not self.chunker.needs_request(now):
                return False
            if not self.watch.has_all():
                return False  # waiting for every camera and the joint state
            age = self.watch.age(now, self._clock_now())
            if age > self.watch.max_age_s:  # a sensor went quiet: acting on old data is worse than waiting
                sensor = self.watch.oldest_sensor(now, self._clock_now())
                self._problem(("old", self.get_namespace()), f"{self.get_namespace()}: sensor data is {age:.1f} s "
                              f"old ({sensor}); waiting", "WARN", count=None)
                return False
            return True

        def _check_loss(self, now: float) -> bool:
            """Under the lock: True when the data goes from fresh to lost now (the caller stops the robot).
            Every such change drops what is in flight, also a second one before chunks resumed."""
            if not self.watch.lost(now, self._clock_now()):
                self._lost_now = False
                return False
            if self._lost_now:
                return False
            self._lost_now = True
            self._epoch += 1  # what is in flight was planned from data that then stopped
            if self._loss_since is None:  # a new loss (not the same one again before chunks resumed)
                self._loss_since = now
                self.stats.sensor_losses += 1
            sensor = self.watch.oldest_sensor(now, self._clock_now())
            self._loss_text = (f"{self.get_namespace()}: sensor loss: no fresh data from {sensor} for "
                               f"{self.watch.age(now, self._clock_now()):.1f} s (sensor_timeout_s="
                               f"{self.watch.timeout_s:g}); " + (f"stopped ({self._hold_name}: hold)"
                                                                 if self.hold_on_loss else "the robot finishes its chunk"))
            if self.hold_on_loss:
                self.chunker.reset()
            return True

        def _tick(self) -> None:
            """At the control rate, on a frame a due request waits for, and when another robot's
            chunk frees an admission slot: sends the request once it is due, admitted and fresh."""
            now = time.monotonic()
            request, refused, give_back, withdraw = None, None, False, False
            worker_down = first_down(conductor.worker_status())  # (cheap: no message to the Workers)
            with self._lock:
                loss_started = self._check_loss(now)
                outage_started, overdue_id = self._check_policy(now, worker_down)
                if self._due_and_fed(now, worker_down):
                    request, refused = self._admitted_request(now)
                elif self._due_since is not None:  # it was due, but its sensors went quiet (or it closes):
                    give_back, withdraw = self._admitted_at is not None, self._admitted_at is None
                    self._due_since, self._admitted_at = None, None  # others need not wait for it
            if loss_started:
                self._on_sensor_loss()
            if overdue_id is not None:  # the runtime stops computing it and frees its KV
                asyncio.run_coroutine_threadsafe(_cancel(conductor, overdue_id), loop)
            if outage_started:
                self._on_policy_outage()
            if give_back or refused is not None:
                self.admission.release()
            if withdraw:
                self.admission.withdraw(self.get_namespace())
            if refused is not None:
                return self._problem(("refused", self.get_namespace()),
                                     f"{self.get_namespace()}: observation refused: {refused}", "ERROR",
                                     count="observations_refused")
            if request is not None:
                if request.request.meta.get("prompt_truncated") and not self._truncation_said:
                    self._truncation_said = True
                    self._say(f"{self.get_namespace()}: prompt {self.prompt!r} with the state is over the "
                              f"checkpoint's tokenizer_max_length={policy.layout.config.max_token_len} tokens: cut "
                              "to it, as the reference does (the state's end is lost: shorten the prompt)", "WARN")
                oldest, epoch = request.oldest, request.epoch
                self._inflight_id = request.request.request_id
                future = asyncio.run_coroutine_threadsafe(_serve(conductor, request.request), loop)
                future.add_done_callback(lambda f: self._on_chunk(f, oldest, epoch))

        def _on_sensor_loss(self) -> None:
            if self.hold_on_loss:
                self._hold()
            self._say(self._loss_text, "ERROR")

        def _hold(self) -> None:
            if not self.closing:
                self.output.hold(self.get_clock().now().to_msg())
                self.stats.stops_published += 1

        @property
        def _hold_name(self) -> str:
            return f"empty {self.output.type_name.rpartition('/')[2]}"

        def _check_policy(self, now: float, worker_down: str | None) -> tuple[bool, str | None]:
            """Under the lock: (whether a policy outage starts now: the caller holds the robot, the id of
            an overdue request to cancel). A Worker down or the chunk in flight overdue is an outage."""
            pending = self.chunker.pending if self._busy else None
            why = self.chunk_watch.problem(now, worker_down, pending.sent_at if pending is not None else None)
            if why is None or self.closing:
                return False, None
            overdue = None
            if worker_down is None:  # the chunk in flight is overdue: whatever it brings is too late
                self.stats.chunks_overdue += 1
                overdue = self._inflight_id
            return self._begin_outage(now, why), overdue

        def _begin_outage(self, now: float, why: str) -> bool:
            """Under the lock: the policy cannot produce chunks (``why``). Drops what is in flight and
            empties the action queue (the robot is told to hold); True when the outage starts now."""
            self._epoch += 1
            self.chunker.reset()
            started = self.chunk_watch.begin(now, why)
            self.stats.policy_outages += started
            return started

        def _outage_text(self) -> str:
            return f"{self.get_namespace()}: {self.chunk_watch.why}; stopped ({self._hold_name}: hold)"

        def _on_policy_outage(self) -> None:
            self._hold()
            text = self._outage_text()
            with self._report_lock:
                self.stats.last_error = text
            self._say(text, "ERROR")

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
            oldest = self.watch.oldest_arrival()
            images = torch.from_numpy(np.stack([image_to_array(self._frames[t]) for t in self.cameras]))
            try:
                state = self.normalization.state.normalize(torch.from_numpy(self._state))
                guide, weights = self.chunker.begin_request(now)
                self._n += 1
                request = policy.request(images, state, self.task, seed=self._n, guide=guide,
                                         guide_weights=weights,
                                         request_id=f"{self.get_namespace().strip('/') or 'robot'}-{self._n}")
            except ValueError as exc:
                self.chunker.pending, self._admitted_at = None, None
                return None, exc
            self._busy = True
            if self.stats.first_request is None:
                self.stats.first_request = now
            return _Outgoing(request, oldest, self._epoch), None

        def _on_chunk(self, future, oldest: float, epoch: int) -> None:
            """On the Conductor's loop thread (rclpy publishers are thread-safe)."""
            try:
                self._deliver(future, oldest, epoch)
            finally:  # outside the node's lock: the freed slot may start another robot's request
                self.admission.release()

        def _deliver(self, future, oldest: float, epoch: int) -> None:
            now = time.monotonic()
            try:
                (chunk,) = future.result()["actions"]
            except Exception as exc:
                failed = not self.closing and not isinstance(exc, (RequestCancelled, asyncio.CancelledError))
                with self._lock:  # nothing else is in flight (_busy): its pending request is this one
                    self._busy, self._admitted_at, self.chunker.pending = False, None, None
                    started = failed and self._begin_outage(now, f"chunk failed: {exc}")
                if failed:
                    self._problem(("failed", self.get_namespace()), f"{self.get_namespace()}: chunk failed: {exc}",
                                  "ERROR", count="chunks_failed")
                if started:
                    self._on_policy_outage()
                return
            resumed, outage = None, None
            with self._lock:
                self._busy, self._admitted_at = False, None
                # a sensor loss came in between, or is under way: planned from data that stopped
                if epoch != self._epoch or self.closing or self.watch.lost(now, self._clock_now()):
                    self.stats.chunks_discarded += not self.closing
                    self.chunker.pending = None
                    return
                start_tick, actions = self.chunker.accept(chunk, now)
                start_in = self.chunker.time_of(start_tick) - now
                stamp = (self.get_clock().now() + _duration(max(0.0, start_in))).to_msg()
                raw = self.normalization.action.unnormalize(actions[:, :self.robot_dims])
                self.output.chunk(raw, stamp)
                self.stats.chunks += 1
                outage = self.chunk_watch.end(now)
                published = time.monotonic()
                self.stats.latencies_s.append(published - oldest)
                self.stats.published_at.append(published)
                if self._loss_since is not None:
                    resumed, self._loss_since = now - self._loss_since, None
            out = self._actions_outside_limits(raw)
            if out:
                self._problem(("chunk limits", self.get_namespace()), f"{self.get_namespace()}: chunk goes outside "
                              f"the joint limits: {', '.join(out)}", "WARN", count="chunks_outside_limits")
            if resumed is not None:
                self._say(f"{self.get_namespace()}: observations and chunks resumed after a {resumed:.1f} s sensor "
                          "loss", "OK")
            if outage is not None:
                self._say(f"{self.get_namespace()}: chunks resumed after {outage:.1f} s without a policy", "OK")

        def _actions_outside_limits(self, raw: torch.Tensor) -> list[str]:
            if self._action_limits is None:
                return []
            cols, names, lower, upper = self._action_limits
            return outside_limits(names, raw.numpy()[:, cols], lower, upper)

        # -- reporting ---------------------------------------------------------------------
        def _problem(self, key, text: str, level: str, *, count: str | None) -> None:
            """Counts a problem and says it, throttled per ``key`` (first at once, then once a period)."""
            if self.closing:
                return
            with self._report_lock:  # callers run on the executor thread and on the Conductor's loop thread
                if count is not None:
                    setattr(self.stats, count, getattr(self.stats, count) + 1)
                self.stats.last_error = text
                self._levels[key] = level
                said = self.throttle.report(key, text, time.monotonic())
            if said is not None:
                self._say(said, level)

        def _values(self) -> dict[str, object]:
            return {**self.stats.counters(), "normalisation": self.normalization.describe()}

        def _say(self, text: str, level: str) -> None:
            if self.closing:
                return
            logger = self.get_logger()  # one call site per severity: rclpy refuses to mix them at one
            if level == "OK":
                logger.info(text)
            elif level == "WARN":
                logger.warning(text)
            else:
                logger.error(text)
            publish_status(self, self.diag_pub, f"mstar: {self.get_fully_qualified_name()}", text,
                           self.get_namespace(), self._values(), level=level)

        def _publish_status(self) -> None:
            """Once a second: the robot's state (ERROR while in a sensor loss), and throttled repeats."""
            with self._report_lock:
                repeats = [(text, self._levels.get(key, "WARN")) for key, text in self.throttle.flush(time.monotonic())]
            for text, level in repeats:
                self._say(text, level)
            if self.closing:
                return
            now, clock = time.monotonic(), self._clock_now()
            with self._lock:
                if self._loss_since is not None:
                    level, text = "ERROR", self._loss_text
                elif self.chunk_watch.active:
                    level, text = "ERROR", self._outage_text()
                elif not self.watch.has_all():
                    level, text = "WARN", f"waiting for data from {self.watch.oldest_sensor(now, clock)}"
                elif self.watch.age(now, clock) > self.watch.max_age_s:
                    level, text = "WARN", (f"sensor data is {self.watch.age(now, clock):.1f} s old "
                                           f"({self.watch.oldest_sensor(now, clock)}): not acted on")
                else:
                    level, text = "OK", "serving"
            publish_status(self, self.diag_pub, f"mstar: {self.get_fully_qualified_name()}", text,
                           self.get_namespace(), self._values(), level=level)

    return PolicyNode()


async def _serve(conductor: Conductor, request) -> dict:
    """On the Conductor's loop: submit() starts tasks, so it must run there, not on an rclpy thread."""
    return await conductor.submit(request).collect()


async def _cancel(conductor: Conductor, request_id: str) -> None:
    """Stops an overdue request in the runtime (its caller then hears RequestCancelled); it may have
    ended meanwhile."""
    with contextlib.suppress(UnknownRequest):
        await conductor.cancel(request_id)


def _duration(seconds: float):
    from rclpy.duration import Duration
    return Duration(seconds=math.floor(seconds), nanoseconds=int((seconds - math.floor(seconds)) * 1e9))
