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
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import torch

from mstar.conductor.request import Request, RequestCancelled, RequestError
from mstar.report_throttle import ReportThrottle
from mstar_graphs.vjepa2.planner import CemParams, plan_request
from mstar_graphs.vjepa2.pose import pose_delta
from mstar_ros.policy.flood_guard import FloodGuard
from mstar_ros.policy.sensor_watch import SensorWatch
from mstar_ros.ros.common.convert import ObservationError, check_image, image_to_array, stamp_seconds
from mstar_ros.ros.common.diagnostics import publish_status
from mstar_ros.ros.common.sensor_subscriptions import SensorSubscriptions
from mstar_ros.ros.vjepa2.params import declare
from mstar_ros.world_model.frames import FramePicker, StateError, check_pose, gripper_state, pose_state
from mstar_ros.world_model.plan_targets import plan_poses, pose_parts

log = logging.getLogger("mstar_ros.world_model")


@dataclass
class WorldModelStats:
    frames: int = 0            # frames that extended the session
    frames_skipped: int = 0    # frames replaced by a newer one before the model took them (it was busy)
    dropped: int = 0           # bad messages dropped (images, poses, gripper readings, early goals)
    dropped_by_topic: Counter = field(default_factory=Counter)  # the same, by resolved topic name
    stamps_refused: int = 0    # of those: stamped too far from this node's clock, or a frozen stamp
    topics_shut: int = 0       # sensor topics unsubscribed for a while: they flooded bad messages
    last_plan_seed: int | None = None
    goals: int = 0
    plans: int = 0
    plans_failed: int = 0
    frames_failed: int = 0
    last_energy: float | None = None
    plan_latencies_s: deque = field(default_factory=lambda: deque(maxlen=10000))
    plan_times_s: deque = field(default_factory=lambda: deque(maxlen=10000))  # time.monotonic() of each plan
    last_frame_at: float | None = None  # time.monotonic() of the newest frame taken
    last_error: str = ""
    last_drop_at: float = -1e9     # time.monotonic() of the newest drop / failure (for /diagnostics)
    last_failure_at: float = -1e9

RECENT_S = 5.0  # /diagnostics says WARN / ERROR for this long after a drop / a failed request


def make_world_model_node(loop: asyncio.AbstractEventLoop, namespace: str, max_frames: int,
                          name: str = "world_model"):
    """The node; its ``conductor`` is set once the runtime is up (the node's parameters size its KV pool)."""
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import PoseStamped
    from nav_msgs.msg import Path
    from rclpy.node import Node
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float64, Float64MultiArray

    class WorldModelNode(Node):
        def __init__(self) -> None:
            super().__init__(name, namespace=namespace)
            self.conductor = None
            self.params = p = declare(self, max_frames)
            self.session = f"vjepa2:{self.get_namespace()}"
            self.window = p.window_frames or (max_frames - p.plan_horizon)
            self.cem = CemParams(samples=p.plan_samples, topk=p.plan_topk, iterations=p.plan_iterations,
                                 maxnorm=p.plan_maxnorm, momentum_mean=p.plan_momentum_mean,
                                 momentum_std=p.plan_momentum_std)
            self.stats = WorldModelStats()
            # stamps judged against the clock within max_observation_age_s either way: a monotonic clock then
            # moves a taken stamp back by at most twice that; further back, the clock itself went back
            self.picker = FramePicker(p.fps, max_back_s=2 * p.max_observation_age_s)
            self.throttle = ReportThrottle(p.report_period_s)
            self._lock = threading.Lock()
            self._resolved = {t: self.resolve_topic_name(t)
                              for t in (p.camera_topic, p.pose_topic, p.gripper_topic, p.goal_topic)}
            # only its stamp verdicts are used (silence is judged below, in _diagnose)
            self.watch = SensorWatch([self._resolved[t] for t in (p.camera_topic, p.pose_topic, p.gripper_topic)],
                                     p.max_observation_age_s, 2.0 / p.fps + 1.0)
            self._unstamped: set[str] = set()
            self.flood_guard = FloodGuard(p.max_bad_rate_hz)
            self._camera_hw = p.expect_hw   # (height, width); None until the first frame when not configured
            self._pose = None      # (stamp, position, orientation, frame_id)
            self._gripper = None   # (stamp, value in [0, 1])
            # the newest frame and goal not yet taken: a busy model skips frames, never queues them up
            self._next_frame = None
            self._next_goal = None
            self._wake = asyncio.Event()
            self.state: torch.Tensor | None = None  # the newest frame's state (the session's pending frame)
            self.goal: torch.Tensor | None = None
            self.closing = False
            self.pub_target = self.create_publisher(PoseStamped, "plan/target_pose", 10)
            self.pub_path = self.create_publisher(Path, "plan/path", 10)
            self.pub_gripper = self.create_publisher(Float64, "plan/gripper", 10)
            self.pub_energy = self.create_publisher(Float64, "plan/energy", 10)
            self.pub_energies = self.create_publisher(Float64MultiArray, "plan/energies", 10)
            self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.sensors = SensorSubscriptions(self, {
                p.camera_topic: lambda: self.create_subscription(Image, p.camera_topic, self._on_camera,
                                                                 qos_profile_sensor_data),
                p.pose_topic: lambda: self.create_subscription(PoseStamped, p.pose_topic, self._on_pose, 10),
                p.gripper_topic: lambda: self.create_subscription(JointState, p.gripper_topic, self._on_gripper, 10),
            }, on_reopen=lambda topic: self.flood_guard.reopened(topic, time.monotonic()),
                closing=lambda: self.closing)
            self.create_subscription(Image, p.goal_topic, self._on_goal, 10)  # reliable: a goal is a command
            self.create_timer(1.0, self._diagnose)
            self._task = asyncio.run_coroutine_threadsafe(self._serve(), loop)

        # -- ROS callbacks (the executor thread): check, keep, hand over ---------------------------
        def _bad(self, topic: str, text: str, *, stamp: bool = False, guard: bool = True) -> None:
            """A message refused: counted on its topic, said throttled (per topic and kind of problem: the text
            with its numbers left out) and, with ``guard`` (on the executor thread), counted against the topic's
            flood limit (sensors only; never from the asyncio side, where an early goal is refused)."""
            now = time.monotonic()
            with self._lock:
                s = self.stats
                s.dropped += 1
                s.dropped_by_topic[self._resolved[topic]] += 1
                s.stamps_refused += stamp
                s.last_error, s.last_drop_at = text, now
                said = self.throttle.report(("bad", topic, re.sub(r"[-\d.]+", "#", text)), text, now)
            if said:
                self.get_logger().warning(f"{said} (dropped)")
            hold = self.flood_guard.bad(topic, now) if guard else None
            if hold is not None and self.sensors.hold(topic, hold):
                self.stats.topics_shut += 1
                self.get_logger().error(f"{self._resolved[topic]}: over max_bad_rate_hz="
                                        f"{self.flood_guard.max_bad_per_s:g} bad messages a second: unsubscribed "
                                        f"for {hold:g} s, then listening again")

        def _judged_stamp(self, topic: str, msg) -> float | None:
            """The message's stamp when the clock lets it be used (the clock's now for an unstamped one, which is
            then judged by arrival); None when it was refused."""
            full, stamp = self._resolved[topic], stamp_seconds(msg)
            clock_now = self.get_clock().now().nanoseconds * 1e-9
            verdict = self.watch.check(full, stamp, clock_now)
            if verdict.kind == "unstamped":
                if full not in self._unstamped:  # said once: such a sensor is judged by arrival alone
                    self._unstamped.add(full)
                    self.get_logger().warning(verdict.text)
                return clock_now
            if not verdict.usable:
                return self._bad(topic, verdict.text, stamp=True)
            self.watch.accept(full, stamp, time.monotonic())
            return stamp

        def _on_pose(self, msg) -> None:
            p, pos, ori = self.params, msg.pose.position, msg.pose.orientation
            position, orientation = (pos.x, pos.y, pos.z), (ori.x, ori.y, ori.z, ori.w)
            try:  # checked on arrival: a bad pose never stands in for the last good one
                check_pose(position, orientation, topic=self._resolved[p.pose_topic], max_position_m=p.max_position_m)
            except StateError as exc:
                return self._bad(p.pose_topic, str(exc))
            stamp = self._judged_stamp(p.pose_topic, msg)
            if stamp is not None:
                with self._lock:
                    self._pose = (stamp, position, orientation, msg.header.frame_id)

        def _on_gripper(self, msg) -> None:
            p = self.params
            topic = self._resolved[p.gripper_topic]
            try:
                i = list(msg.name).index(p.gripper_joint)
                value = gripper_state(float(msg.position[i]), p.gripper_max, topic=topic)
            except StateError as exc:
                return self._bad(p.gripper_topic, f"{exc} (joint {p.gripper_joint!r})")
            except (ValueError, IndexError):
                return self._bad(p.gripper_topic, f"{topic}: no position for joint {p.gripper_joint!r}")
            stamp = self._judged_stamp(p.gripper_topic, msg)
            if stamp is not None:
                with self._lock:
                    self._gripper = (stamp, value)

        def _on_camera(self, msg) -> None:
            p = self.params
            topic = self._resolved[p.camera_topic]
            try:
                self._check_camera_image(msg, topic)
            except ObservationError as exc:
                return self._bad(p.camera_topic, str(exc))
            stamp = self._judged_stamp(p.camera_topic, msg)
            if stamp is None:
                return
            try:
                with self._lock:
                    pose, grip = self._pose, self._gripper
                if pose is None or grip is None:
                    raise ObservationError(f"{topic}: no end-effector pose or gripper reading yet")
                age = max(abs(stamp - pose[0]), abs(stamp - grip[0]))
                if age > p.max_pose_age_s:
                    raise ObservationError(f"{topic}: the nearest pose or gripper reading is {age:.2f} s "
                                           f"from the frame (max_pose_age_s {p.max_pose_age_s:g})")
                state = pose_state(pose[1], pose[2], grip[1], topic=self._resolved[p.pose_topic])
            except (ObservationError, StateError) as exc:
                return self._bad(p.camera_topic, str(exc))
            if not self.picker.due(stamp):
                return  # between the model's frames
            loop.call_soon_threadsafe(self._offer, "frame", (image_to_array(msg), state, pose[3]))

        def _check_camera_image(self, msg, topic: str) -> None:
            """The image is readable and of the camera's size: the configured one, or else its first frame's."""
            held = self._camera_hw is not None and self.params.expect_hw is None
            check_image(msg, topic=topic, expect_hw=None if held else self._camera_hw)
            size = (int(msg.height), int(msg.width))
            if held and size != self._camera_hw:
                (h, w), (held_h, held_w) = size, self._camera_hw
                raise ObservationError(f"{topic}: image is {w}x{h}, this camera's frames are {held_w}x{held_h} "
                                       "(its first frame's size: image_height/width are 0)")
            if self._camera_hw is None:
                self._camera_hw = size
                self.get_logger().info(f"{topic}: taking {size[1]}x{size[0]} frames (the first frame's size; "
                                       "image_height/width are 0): frames of another size will be dropped")

        def _on_goal(self, msg) -> None:
            try:
                check_image(msg, topic=self._resolved[self.params.goal_topic])
            except ObservationError as exc:  # a goal is a command: said, never shut out
                return self._bad(self.params.goal_topic, str(exc), guard=False)
            loop.call_soon_threadsafe(self._offer, "goal", image_to_array(msg))

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
                    if await self._guarded(self._add_frame(image, state)) and self.goal is not None \
                            and self._next_frame is None:  # plan from the newest frame
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
                    said = self.throttle.report(("failed", re.sub(r"[-\d.]+", "#", text[:80])), text,
                                                time.monotonic())
                if said:
                    self.get_logger().error(said)
                return False

        async def _add_frame(self, image, state: torch.Tensor) -> None:
            action = pose_delta(self.state, state).float() if self.state is not None else torch.zeros(7)
            req = Request({"frames": torch.from_numpy(image)[None], "states": state[None], "actions": action[None]},
                          session_id=self.session, meta={"walk": "observe", "context.kv_window": self.window})
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
                return self._bad(self.params.goal_topic, f"{self._resolved[self.params.goal_topic]}: a goal before "
                                 "any frame (the session has nothing to plan from)", guard=False)
            out = await self.conductor.submit(Request({"frames": torch.from_numpy(image)}, meta={"walk": "encode"})).collect()
            self.goal = out["latents"][0]
            self.stats.goals += 1
            self.get_logger().info(f"goal set: planning {self.params.plan_horizon} actions after every frame")

        async def _plan(self, frame_id: str) -> None:
            started = time.monotonic()
            state = self.state
            seed = self.params.seed if self.params.seed >= 0 else self.stats.plans
            self.stats.last_plan_seed = seed
            try:
                out = await self.conductor.submit(plan_request(self.goal, self.params.plan_horizon, self.cem,
                                                               session_id=self.session, seed=seed)).collect()
            except RequestError:
                self.stats.plans_failed += 1
                self.stats.last_failure_at = time.monotonic()
                raise
            self.stats.plan_times_s.append(time.monotonic())
            self.stats.plan_latencies_s.append(self.stats.plan_times_s[-1] - started)
            self.stats.plans += 1
            self._publish(state, out["plan"][-1], out["energies"][-1], self.params.frame_id or frame_id)

        def _publish(self, state: torch.Tensor, plan: torch.Tensor, energies: torch.Tensor, frame_id: str) -> None:
            stamp = self.get_clock().now().to_msg()
            path = Path()
            path.header.stamp, path.header.frame_id = stamp, frame_id
            poses = plan_poses(state, plan)
            for pose in poses:
                (x, y, z), (qx, qy, qz, qw), _ = pose_parts(pose)
                ps = PoseStamped()
                ps.header = path.header
                ps.pose.position.x, ps.pose.position.y, ps.pose.position.z = x, y, z
                ps.pose.orientation.x, ps.pose.orientation.y, ps.pose.orientation.z, ps.pose.orientation.w = qx, qy, qz, qw
                path.poses.append(ps)
            self.pub_target.publish(path.poses[0])
            self.pub_path.publish(path)
            self.pub_gripper.publish(Float64(data=float(poses[0][6])))
            self.stats.last_energy = float(energies.min())
            self.pub_energy.publish(Float64(data=self.stats.last_energy))
            self.pub_energies.publish(Float64MultiArray(data=[float(e) for e in energies]))

        @property
        def kv_frames_needed(self) -> int:
            """KV frame blocks this robot can hold at once: its window and one plan's samples x horizon."""
            return self.window + self.cem.samples * self.params.plan_horizon

        def _diagnose(self) -> None:
            now = time.monotonic()
            with self._lock:
                repeats = self.throttle.flush(now)
            for _key, text in repeats:  # the count of what was not said yet: nothing is lost silently
                self.get_logger().warning(text)
            if self.conductor is None:
                return
            s = self.stats
            silent = s.last_frame_at is not None and now - s.last_frame_at > 2.0 / self.params.fps + 1.0
            level = ("ERROR" if now - s.last_failure_at < RECENT_S else
                     "WARN" if now - s.last_drop_at < RECENT_S or silent else "OK")
            if silent:
                s.last_error = f"no frame for {now - s.last_frame_at:.1f} s (camera, pose or gripper silent?)"
            message = (f"{s.frames} frames, {s.plans} plans" if level == "OK"
                       else f"{s.frames} frames, {s.plans} plans; last problem: {s.last_error}")
            publish_status(self, self.pub_diag, f"mstar: {self.get_namespace()}/world_model", message, "vjepa2_ac",
                           {"frames": s.frames, "messages_dropped": s.dropped,
                            "last_frame_age_s": "" if s.last_frame_at is None else f"{now - s.last_frame_at:.2f}", "frames_skipped": s.frames_skipped,
                            "frames_failed": s.frames_failed,
                            "goals": s.goals, "plans": s.plans, "plans_failed": s.plans_failed,
                            "stamps_refused": s.stamps_refused, "topics_shut": s.topics_shut,
                            "last_plan_seed": "" if s.last_plan_seed is None else s.last_plan_seed,
                            **{f"dropped {topic}": n for topic, n in sorted(s.dropped_by_topic.items())},
                            "last_energy": "" if s.last_energy is None else f"{s.last_energy:.5f}",
                            "window_frames": self.window,
                            "kv_blocks_used_all_robots": self.conductor.kv_blocks_used() if self.conductor else 0},
                           level)

        def close(self) -> None:
            self.closing = True
            self._task.cancel()
            if self.conductor is not None:
                self.conductor.close_session(self.session)

    return WorldModelNode()
