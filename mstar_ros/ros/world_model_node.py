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

Bad input (wrong image size or encoding, a NaN or non-unit pose, no pose near a frame, a goal
before any frame) is reported (throttled) and dropped; the session keeps serving. A model
slower than ``fps`` skips frames (the newest one waits, counted as skipped): frames never queue
up behind it. Health on /diagnostics once a second.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from mstar.conductor.request import Request, RequestCancelled, RequestError
from mstar.engine.sampling_params import SamplingParams
from mstar_graphs.vjepa2.planner import CemParams, initial_belief
from mstar_graphs.vjepa2.pose import pose_delta
from mstar_ros.ros.convert import ObservationError, check_image, image_to_array, stamp_seconds
from mstar_ros.ros.diagnostics import publish_status
from mstar_ros.ros.report_throttle import ReportThrottle
from mstar_ros.ros.world_model_params import declare
from mstar_ros.world_model.frames import FramePicker, StateError, pose_state
from mstar_ros.world_model.plan_targets import plan_poses, pose_parts

log = logging.getLogger("mstar_ros.world_model")


@dataclass
class WorldModelStats:
    frames: int = 0            # frames that extended the session
    frames_skipped: int = 0    # frames replaced by a newer one before the model took them (it was busy)
    dropped: int = 0           # bad messages dropped (images, poses, gripper readings, early goals)
    goals: int = 0
    plans: int = 0
    plans_failed: int = 0
    frames_failed: int = 0
    last_energy: float | None = None
    plan_latencies_s: deque = field(default_factory=lambda: deque(maxlen=10000))
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
            self.picker = FramePicker(p.fps)
            self.throttle = ReportThrottle(p.report_period_s)
            self._lock = threading.Lock()
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
            self.create_subscription(Image, p.camera_topic, self._on_camera, qos_profile_sensor_data)
            self.create_subscription(PoseStamped, p.pose_topic, self._on_pose, 10)
            self.create_subscription(JointState, p.gripper_topic, self._on_gripper, 10)
            self.create_subscription(Image, p.goal_topic, self._on_goal, 10)  # reliable: a goal is a command
            self.create_timer(1.0, self._diagnose)
            self._task = asyncio.run_coroutine_threadsafe(self._serve(), loop)

        # -- ROS callbacks (the executor thread): check, keep, hand over ---------------------------
        def _bad(self, topic: str, text: str) -> None:
            """A message not used (from the executor thread, or the asyncio side for an early goal)."""
            with self._lock:
                self.stats.dropped += 1
                self.stats.last_error = text
                self.stats.last_drop_at = time.monotonic()
                said = self.throttle.report((topic, text.split(":")[-1][:40]), text, time.monotonic())
            if said:
                self.get_logger().warning(f"{said} (dropped)")

        def _on_pose(self, msg) -> None:
            pos, ori = msg.pose.position, msg.pose.orientation
            try:  # checked on arrival: a bad pose never stands in for the last good one
                pose_state((pos.x, pos.y, pos.z), (ori.x, ori.y, ori.z, ori.w), 0.0, topic=self.params.pose_topic)
            except StateError as exc:
                return self._bad(self.params.pose_topic, str(exc))
            with self._lock:
                self._pose = (stamp_seconds(msg), (pos.x, pos.y, pos.z), (ori.x, ori.y, ori.z, ori.w),
                              msg.header.frame_id)

        def _on_gripper(self, msg) -> None:
            try:
                i = list(msg.name).index(self.params.gripper_joint)
                value = float(msg.position[i]) / self.params.gripper_max
            except (ValueError, IndexError):
                return self._bad(self.params.gripper_topic, f"{self.params.gripper_topic}: no position for joint "
                                                            f"{self.params.gripper_joint!r}")
            with self._lock:
                self._gripper = (stamp_seconds(msg), value)

        def _on_camera(self, msg) -> None:
            p = self.params
            try:
                check_image(msg, topic=p.camera_topic, expect_hw=p.expect_hw)
                stamp = stamp_seconds(msg)
                with self._lock:
                    pose, grip = self._pose, self._gripper
                if pose is None or grip is None:
                    raise ObservationError(f"{p.camera_topic}: no end-effector pose or gripper reading yet")
                age = max(abs(stamp - pose[0]), abs(stamp - grip[0]))
                if age > p.max_pose_age_s:
                    raise ObservationError(f"{p.camera_topic}: the nearest pose or gripper reading is {age:.2f} s "
                                           f"from the frame (max_pose_age_s {p.max_pose_age_s:g})")
                state = pose_state(pose[1], pose[2], grip[1], topic=p.pose_topic)
            except (ObservationError, StateError) as exc:
                return self._bad(p.camera_topic, str(exc))
            if not self.picker.due(stamp):
                return  # between the model's frames
            loop.call_soon_threadsafe(self._offer, "frame", (image_to_array(msg), state, pose[3]))

        def _on_goal(self, msg) -> None:
            try:
                check_image(msg, topic=self.params.goal_topic)
            except ObservationError as exc:
                return self._bad(self.params.goal_topic, str(exc))
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
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                self.get_logger().error(self.stats.last_error)
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
                return self._bad(self.params.goal_topic, f"{self.params.goal_topic}: a goal before any frame "
                                                         f"(the session has nothing to plan from)")
            out = await self.conductor.submit(Request({"frames": torch.from_numpy(image)}, meta={"walk": "encode"})).collect()
            self.goal = out["latents"][0]
            self.stats.goals += 1
            self.get_logger().info(f"goal set: planning {self.params.plan_horizon} actions after every frame")

        async def _plan(self, frame_id: str) -> None:
            mean, std = initial_belief(self.params.plan_horizon, self.cem)
            started = time.monotonic()
            state = self.state
            try:
                out = await self.conductor.submit(Request(
                    {"goal": self.goal, "mean": mean, "std": std, "params": self.cem.tensor()},
                    session_id=self.session, sampling=SamplingParams(seed=self.stats.plans),
                    meta={"walk": "plan", "iterations": self.cem.iterations},
                    outputs=frozenset({"plan", "energies"}))).collect()
            except RequestError:
                self.stats.plans_failed += 1
                self.stats.last_failure_at = time.monotonic()
                raise
            self.stats.plan_latencies_s.append(time.monotonic() - started)
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
            if self.conductor is None:
                return
            s = self.stats
            now = time.monotonic()
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
