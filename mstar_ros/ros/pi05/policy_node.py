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

The node is made of parts, one concern each: sensor_inputs (cameras, joint states), task_input
(the prompt), control_tick (when to send an observation, admission), safety_stops (sensor loss,
policy outage), chunk_publishing (chunks out), robot_status (logs, /diagnostics). This module
imports rclpy: the node set imports it where ROS runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from rclpy.node import Node

from mstar.conductor import Conductor
from mstar_graphs.pi05.prompt import PromptError
from mstar_ros.policy.admission import ChunkAdmission
from mstar_ros.ros.pi05.chunk_publishing import ChunkPublishing
from mstar_ros.ros.pi05.control_tick import ControlTick
from mstar_ros.ros.pi05.params import PolicyParams, declare
from mstar_ros.ros.pi05.params_fit import check_fits
from mstar_ros.ros.pi05.robot_stats import RobotStats
from mstar_ros.ros.pi05.robot_status import RobotStatus
from mstar_ros.ros.pi05.safety_stops import SafetyStops
from mstar_ros.ros.pi05.sensor_inputs import SensorInputs
from mstar_ros.ros.pi05.task_input import TaskInput

log = logging.getLogger("mstar_ros.policy")

__all__ = ["PolicyNode"]


class PolicyNode(SensorInputs, TaskInput, ControlTick, SafetyStops, ChunkPublishing, RobotStatus, Node):
    def __init__(
        self,
        policy,
        conductor: Conductor,
        loop: asyncio.AbstractEventLoop,
        namespace: str,
        overrides: dict | None = None,
        admission: ChunkAdmission | None = None,
    ) -> None:
        """``policy``: a mstar_graphs.pi05.frontend.Pi05Policy; rclpy must be initialised. ``overrides``
        replace parameter defaults (a params file or ``-p`` still wins, as for any declared parameter);
        ``admission`` is the node set's in-flight limit, shared by its robots (default: none). ValueError
        (naming the parameter) when the parameters do not fit the checkpoint."""
        super().__init__("pi05_policy", namespace=namespace)
        self.policy, self.conductor, self.loop = policy, conductor, loop
        p = self.params = declare(self, policy.cameras, policy.layout.placeholder_cameras, overrides)
        self._take_parameters(p)
        self.stats = RobotStats()
        self.closing = False  # set before the node is destroyed: late chunks are dropped quietly
        self._lock = threading.Lock()  # the executor thread and the Conductor's loop thread both come here
        self._start_sensor_inputs(p)
        self._start_safety(p)
        self._start_control(p, admission)
        self._start_status(p)
        self._subscribe_sensors()
        self._subscribe_task()
        self._start_chunk_publishing(p)
        self._publish_diagnostics()
        self._start_ticking()
        self.get_logger().info(
            f"cameras {', '.join(f'{n} <- {self._full(t)}' for n, t in self.camera_topics.items())}"
            + "".join(
                f"; {n}: none (left out, as the references mask a missing camera)"
                for n, t in p.cameras.items()
                if not t
            )
            + f"; normalisation: {self.normalization.describe()}"
            + f"; actions: {p.action_space} {', '.join(self.action_names)} ({self.output.type_name})"
        )

    def _take_parameters(self, p: PolicyParams) -> None:
        """What the node reads from its parameters, checked against the checkpoint (ValueError)."""
        policy, where = self.policy, self.get_fully_qualified_name()
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
            raise ValueError(
                f"{where}: parameter max_prompt_tokens: {self.token_cap} is over the checkpoint's "
                f"tokenizer_max_length={budget} (a prompt that long leaves no room for the state)"
            )
        try:
            self.task = policy.task(p.prompt, max_tokens=self.token_cap)
        except PromptError as exc:
            raise ValueError(f"{where}: parameter prompt: {exc}") from None
        self.prompt = self.task.text
        self.rate = p.control_rate_hz
