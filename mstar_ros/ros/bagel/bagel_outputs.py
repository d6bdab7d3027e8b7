"""A BAGEL node's messages out: answers (std_msgs/String) and goal images (sensor_msgs/Image rgb8, stamped as
the frame they were made from) (a part of BagelNode)."""

from __future__ import annotations

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from sensor_msgs.msg import Image
from std_msgs.msg import String

from mstar_ros.ros.bagel.params import BagelParams


class BagelOutputs:
    """BagelNode's publishers."""

    def _start_publishers(self, p: BagelParams) -> None:
        self.pub_answer = self.create_publisher(String, p.answer_topic, 10)
        self.pub_goal = self.create_publisher(Image, p.goal_topic, 10)  # reliable, as the world model reads goals
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)

    def _publish_answer(self, text: str) -> None:
        self.pub_answer.publish(String(data=text))

    def _publish_goal(self, pixels: np.ndarray, stamp, frame_id: str) -> None:
        height, width = pixels.shape[:2]
        msg = Image(encoding="rgb8", height=height, width=width, step=width * 3, is_bigendian=0)
        msg.header.stamp, msg.header.frame_id = stamp, frame_id
        msg.data = np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()  # bytes: fast into the message
        self.pub_goal.publish(msg)
