"""One robot's V-JEPA 2-AC world model as a ROS 2 node: a persistent session fed by its sensors,
plans toward a goal image out as poses.

Subscribes in its namespace to the camera (sensor_msgs/Image, sensor-data QoS), the end-effector
pose (geometry_msgs/PoseStamped) and the gripper (sensor_msgs/JointState). Frames at ``fps``
(by ``header.stamp``; mstar_ros.world_model.frames) extend the robot's session in the runtime:
each frame is encoded and joins the context with the action between its pose and the previous
frame's (as Meta's code derives actions), so the context's K/V are computed once and kept across
messages; the window is bounded (``window_frames``), sliding exactly. A ``goal_image`` message
starts or updates planning: after every new frame the node plans (CEM over the session's KV)
and publishes

- ``plan/target_pose`` (geometry_msgs/PoseStamped): where the first planned action leads;
- ``plan/path`` (nav_msgs/Path): the pose after each planned action;
- ``plan/gripper`` (std_msgs/Float64): the gripper target of the first action, 0 open .. 1 closed;
- ``plan/energy`` (std_msgs/Float64) and ``plan/energies`` (std_msgs/Float64MultiArray): the
  best and every sample's energy (mean L1 to the goal latent) of the last CEM iteration.

Bad input is refused on arrival, counted on its topic, reported (the same problem once per
``report_period_s`` with a count) and dropped; the session keeps serving and nothing bad reaches
the engine. Bad input: a wrong image size or encoding; a camera, pose or gripper message stamped
more than ``max_observation_age_s`` before or after this node's clock, or with its last stamp
again (as the pi0.5 node judges: mstar_ros.policy.sensor_watch); a pose or gripper reading that
is not finite or out of bounds (mstar_ros.world_model.frames); no pose near a frame; a goal before
any frame. A sensor topic flooding bad messages is unsubscribed for a while
(``max_bad_rate_hz``, mstar_ros.policy.flood_guard), so a flood costs the other robots nothing.
With ``image_height`` / ``image_width`` 0 the camera's first frame sets the size (logged once).
Each plan is seeded (``seed``; /diagnostics says the last plan's seed), so a plan can be
reproduced. A model slower than ``fps`` skips frames (the newest one waits, counted as
skipped): frames never queue up behind it. Health on /diagnostics once a second.

Its sensor callbacks are in world_model_inputs, its plan's messages in plan_publishing, its
counters and /diagnostics in world_model_status. This module imports rclpy: the node set imports it where ROS runs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time

import torch
from rclpy.node import Node

from mstar.report_throttle import ReportThrottle
from mstar.request import RequestCancelled, RequestError
from mstar_graphs.vjepa2.frontend import encode_request, observe_request, plan_request
from mstar_graphs.vjepa2.planner import CemParams
from mstar_graphs.vjepa2.pose import pose_delta
from mstar_ros.policy.flood_guard import FloodGuard
from mstar_ros.policy.sensor_watch import SensorWatch
from mstar_ros.ros.vjepa2.params import declare
from mstar_ros.ros.vjepa2.plan_publishing import PlanPublishing
from mstar_ros.ros.vjepa2.world_model_inputs import WorldModelInputs
from mstar_ros.ros.vjepa2.world_model_status import WorldModelStats, WorldModelStatus
from mstar_ros.world_model.frames import FramePicker

log = logging.getLogger("mstar_ros.world_model")

__all__ = ["WorldModelNode"]


class WorldModelNode(WorldModelInputs, PlanPublishing, WorldModelStatus, Node):
    def __init__(
        self, loop: asyncio.AbstractEventLoop, namespace: str, max_frames: int, name: str = "world_model"
    ) -> None:
        """Its ``conductor`` is set once the runtime is up (the node's parameters size its KV pool)."""
        super().__init__(name, namespace=namespace)
        self.loop = loop
        self.conductor = None
        self.params = p = declare(self, max_frames)
        self.session = f"vjepa2:{self.get_namespace()}"
        self.window = p.window_frames or (max_frames - p.plan_horizon)
        self.cem = CemParams(
            samples=p.plan_samples,
            topk=p.plan_topk,
            iterations=p.plan_iterations,
            maxnorm=p.plan_maxnorm,
            momentum_mean=p.plan_momentum_mean,
            momentum_std=p.plan_momentum_std,
        )
        self.stats = WorldModelStats()
        # stamps judged against the clock within max_observation_age_s either way: a monotonic clock then
        # moves a taken stamp back by at most twice that; further back, the clock itself went back
        self.picker = FramePicker(p.fps, max_back_s=2 * p.max_observation_age_s)
        self.throttle = ReportThrottle(p.report_period_s)
        self._lock = threading.Lock()
        self._resolved = {
            t: self.resolve_topic_name(t) for t in (p.camera_topic, p.pose_topic, p.gripper_topic, p.goal_topic)
        }
        # only its stamp verdicts are used (silence is judged by _diagnose, in world_model_status)
        self.watch = SensorWatch(
            [self._resolved[t] for t in (p.camera_topic, p.pose_topic, p.gripper_topic)],
            p.max_observation_age_s,
            2.0 / p.fps + 1.0,
        )
        self._unstamped: set[str] = set()
        self.flood_guard = FloodGuard(p.max_bad_rate_hz)
        self._camera_hw = p.expect_hw  # (height, width); None until the first frame when not configured
        self._pose = None  # (stamp, position, orientation, frame_id)
        self._gripper = None  # (stamp, value in [0, 1])
        # the newest frame and goal not yet taken: a busy model skips frames, never queues them up
        self._next_frame = None
        self._next_goal = None
        self._wake = asyncio.Event()
        self.state: torch.Tensor | None = None  # the newest frame's state (the session's pending frame)
        self.goal: torch.Tensor | None = None
        self.closing = False
        self._start_publishers()
        self._subscribe_inputs(p)
        self.create_timer(1.0, self._diagnose)
        self._task = asyncio.run_coroutine_threadsafe(self._serve(), loop)

    # -- the runtime side (the asyncio loop) ------------------------------------------------
    def _offer(self, kind: str, item) -> None:  # on the asyncio loop
        if kind == "goal":
            self._next_goal = item
        else:
            if self._next_frame is not None:
                self.stats.frames_skipped += 1
            self._next_frame = item
        self._wake.set()

    async def _serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            goal, self._next_goal = self._next_goal, None
            frame, self._next_frame = self._next_frame, None
            if goal is not None:
                await self._guarded(self._set_goal(goal))
            if frame is not None:
                image, state, frame_id = frame
                if (
                    await self._guarded(self._add_frame(image, state))
                    and self.goal is not None
                    and self._next_frame is None
                ):  # plan from the newest frame
                    await self._guarded(self._plan(frame_id))

    async def _guarded(self, work) -> bool:
        """Runs one request; a failure is reported and the session keeps serving. True when it succeeded."""
        try:
            await work
            return True
        except (RequestCancelled, asyncio.CancelledError):
            if self.closing:
                raise
            return False
        except Exception as exc:
            text = self.stats.last_error = f"{type(exc).__name__}: {exc}"
            with self._lock:  # said throttled as bad input is: a failing engine fails every frame
                said = self.throttle.report(("failed", re.sub(r"[-\d.]+", "#", text[:80])), text, time.monotonic())
            if said:
                self.get_logger().error(said)
            return False

    async def _add_frame(self, image, state: torch.Tensor) -> None:
        action = pose_delta(self.state, state).float() if self.state is not None else torch.zeros(7)
        req = observe_request(
            torch.from_numpy(image)[None],
            state[None],
            action[None],
            session_id=self.session,
            kv_window=self.window,
            priority=self.params.priority,
        )
        try:
            await self.conductor.submit(req).collect()
        except RequestError:
            self.stats.frames_failed += 1
            self.stats.last_failure_at = time.monotonic()
            raise
        self.state = state
        self.stats.frames += 1
        self.stats.last_frame_at = time.monotonic()

    async def _set_goal(self, image) -> None:
        if self.state is None:
            return self._bad(
                self.params.goal_topic,
                f"{self._resolved[self.params.goal_topic]}: a goal before "
                "any frame (the session has nothing to plan from)",
                guard=False,
            )
        out = await self.conductor.submit(
            encode_request(torch.from_numpy(image), priority=self.params.priority)
        ).collect()
        self.goal = out["latents"][0]
        self.stats.goals += 1
        self.get_logger().info(f"goal set: planning {self.params.plan_horizon} actions after every frame")

    async def _plan(self, frame_id: str) -> None:
        started = time.monotonic()
        state = self.state
        seed = self.params.seed if self.params.seed >= 0 else self.stats.plans
        self.stats.last_plan_seed = seed
        try:
            out = await self.conductor.submit(
                plan_request(
                    self.goal,
                    self.params.plan_horizon,
                    self.cem,
                    session_id=self.session,
                    seed=seed,
                    priority=self.params.priority,
                )
            ).collect()
        except RequestError:
            self.stats.plans_failed += 1
            self.stats.last_failure_at = time.monotonic()
            raise
        self.stats.plan_times_s.append(time.monotonic())
        self.stats.plan_latencies_s.append(self.stats.plan_times_s[-1] - started)
        self.stats.plans += 1
        self._publish(state, out["plan"][-1], out["energies"][-1], self.params.frame_id or frame_id)

    @property
    def kv_frames_needed(self) -> int:
        """KV frame blocks this robot can hold at once: its window and one plan's samples x horizon."""
        return self.window + self.cem.samples * self.params.plan_horizon

    def close(self) -> None:
        self.closing = True
        self._task.cancel()
        if self.conductor is not None:
            self.conductor.close_session(self.session)
