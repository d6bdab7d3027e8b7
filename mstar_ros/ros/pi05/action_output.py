"""Where a robot's action chunks go, by ``action_space``: one publisher on ``action_chunk``.

- ``joint_positions`` / ``joint_velocities``: trajectory_msgs/JointTrajectory, the action names
  as ``joint_names``, one point per action (its positions / velocities) 1 / rate apart from
  ``header.stamp``; the hold is an empty trajectory (JointTrajectoryController: stop and hold).
- ``labelled_array``: std_msgs/Float32MultiArray [time, action] labelled with the action names
  (end-effector deltas, anything that is not a joint's position or velocity); the hold is zero
  rows. It has no header: the first row is due at the next control tick after it arrives.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mstar_ros.ros.common.convert import labelled_array_msg, trajectory_msg

_FIELD = {"joint_positions": "positions", "joint_velocities": "velocities"}


class ActionOutput:
    def __init__(self, node, space: str, names: Sequence[str], rate_hz: float, topic: str = "action_chunk") -> None:
        from std_msgs.msg import Float32MultiArray
        from trajectory_msgs.msg import JointTrajectory

        if space not in (*_FIELD, "labelled_array"):
            raise ValueError(f"action_space {space!r}: one of {', '.join((*_FIELD, 'labelled_array'))}")
        self.space, self.names, self.rate_hz = space, list(names), rate_hz
        msg_type = Float32MultiArray if space == "labelled_array" else JointTrajectory
        self.type_name = (
            "std_msgs/Float32MultiArray" if space == "labelled_array" else "trajectory_msgs/JointTrajectory"
        )
        self.pub = node.create_publisher(msg_type, topic, 10)

    def chunk(self, actions: torch.Tensor, start_stamp) -> None:
        """Publishes ``actions`` [rows, len(names)], the first due at ``start_stamp`` (builtin_interfaces/Time)."""
        self.pub.publish(self._msg(actions, start_stamp))

    def hold(self, stamp) -> None:
        """Publishes the message that stops the robot where it is (no actions)."""
        self.pub.publish(self._msg(None, stamp))

    def _msg(self, actions: torch.Tensor | None, stamp):
        if self.space == "labelled_array":
            return labelled_array_msg(self.names, actions)
        return trajectory_msg(self.names, actions, self.rate_hz, stamp, field=_FIELD[self.space])
