"""A world-model node's plan out: target pose, path, gripper target and energies (a part of WorldModelNode)."""

from __future__ import annotations

import torch
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Path
from std_msgs.msg import Float64, Float64MultiArray

from mstar_ros.world_model.plan_targets import plan_poses, pose_parts


class PlanPublishing:
    """WorldModelNode's publishers."""

    def _start_publishers(self) -> None:
        self.pub_target = self.create_publisher(PoseStamped, "plan/target_pose", 10)
        self.pub_path = self.create_publisher(Path, "plan/path", 10)
        self.pub_gripper = self.create_publisher(Float64, "plan/gripper", 10)
        self.pub_energy = self.create_publisher(Float64, "plan/energy", 10)
        self.pub_energies = self.create_publisher(Float64MultiArray, "plan/energies", 10)
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)

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
