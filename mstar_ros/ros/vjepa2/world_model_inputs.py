"""A world-model node's inputs: camera, end-effector pose, gripper and goal, checked on arrival
(a part of WorldModelNode).

A bad message is refused, counted on its topic, reported throttled and dropped; a sensor topic
flooding bad messages is unsubscribed for a while (mstar_ros.policy.flood_guard). A frame due at
``fps`` and a goal are handed to the runtime side on the asyncio loop.
"""

from __future__ import annotations

import re
import time

from geometry_msgs.msg import PoseStamped
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState

from mstar_ros.ros.common.convert import ObservationError, check_image, image_to_array, stamp_seconds
from mstar_ros.ros.common.sensor_subscriptions import SensorSubscriptions
from mstar_ros.ros.vjepa2.params import WorldModelParams
from mstar_ros.world_model.frames import StateError, check_pose, gripper_state, pose_state


class WorldModelInputs:
    """WorldModelNode's ROS callbacks (the executor thread): check, keep, hand over."""

    def _subscribe_inputs(self, p: WorldModelParams) -> None:
        self.sensors = SensorSubscriptions(
            self,
            {
                p.camera_topic: lambda: self.create_subscription(
                    Image, p.camera_topic, self._on_camera, qos_profile_sensor_data
                ),
                p.pose_topic: lambda: self.create_subscription(PoseStamped, p.pose_topic, self._on_pose, 10),
                p.gripper_topic: lambda: self.create_subscription(JointState, p.gripper_topic, self._on_gripper, 10),
            },
            on_reopen=lambda topic: self.flood_guard.reopened(topic, time.monotonic()),
            closing=lambda: self.closing,
        )
        self.create_subscription(Image, p.goal_topic, self._on_goal, 10)  # reliable: a goal is a command

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
            self.get_logger().error(
                f"{self._resolved[topic]}: over max_bad_rate_hz="
                f"{self.flood_guard.max_bad_per_s:g} bad messages a second: unsubscribed "
                f"for {hold:g} s, then listening again"
            )

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
                raise ObservationError(
                    f"{topic}: the nearest pose or gripper reading is {age:.2f} s "
                    f"from the frame (max_pose_age_s {p.max_pose_age_s:g})"
                )
            state = pose_state(pose[1], pose[2], grip[1], topic=self._resolved[p.pose_topic])
        except (ObservationError, StateError) as exc:
            return self._bad(p.camera_topic, str(exc))
        if not self.picker.due(stamp):
            return  # between the model's frames
        self.loop.call_soon_threadsafe(self._offer, "frame", (image_to_array(msg), state, pose[3]))

    def _check_camera_image(self, msg, topic: str) -> None:
        """The image is readable and of the camera's size: the configured one, or else its first frame's."""
        held = self._camera_hw is not None and self.params.expect_hw is None
        check_image(msg, topic=topic, expect_hw=None if held else self._camera_hw)
        size = (int(msg.height), int(msg.width))
        if held and size != self._camera_hw:
            (h, w), (held_h, held_w) = size, self._camera_hw
            raise ObservationError(
                f"{topic}: image is {w}x{h}, this camera's frames are {held_w}x{held_h} "
                "(its first frame's size: image_height/width are 0)"
            )
        if self._camera_hw is None:
            self._camera_hw = size
            self.get_logger().info(
                f"{topic}: taking {size[1]}x{size[0]} frames (the first frame's size; "
                "image_height/width are 0): frames of another size will be dropped"
            )

    def _on_goal(self, msg) -> None:
        try:
            check_image(msg, topic=self._resolved[self.params.goal_topic])
        except ObservationError as exc:  # a goal is a command: said, never shut out
            return self._bad(self.params.goal_topic, str(exc), guard=False)
        self.loop.call_soon_threadsafe(self._offer, "goal", image_to_array(msg))
