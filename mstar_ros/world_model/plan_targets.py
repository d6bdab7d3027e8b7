"""A CEM plan [H, 7] (actions from the current state) as the poses it leads to.

The first action's target is what a robot stack steps toward now (receding-horizon MPC, as
Meta's notebook executes the first row); the rest is the horizon. Each pose follows from the
previous one as Meta's ``compute_new_pose`` does (xyz added, rotation R_delta @ R, gripper
clipped to [0, 1]).
"""

from __future__ import annotations

import torch

from mstar_graphs.vjepa2.pose import euler_to_quaternion, next_pose


def plan_poses(state: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
    """state [7], plan [H, 7] -> the H poses [H, 7] after each action."""
    poses, current = [], state.float()
    for action in plan.float():
        current = next_pose(current, action)
        poses.append(current)
    return torch.stack(poses)


def pose_parts(pose: torch.Tensor) -> tuple[tuple[float, float, float], tuple[float, float, float, float], float]:
    """[7] -> (position, orientation quaternion (x, y, z, w), gripper)."""
    q = euler_to_quaternion(pose[3:6].double()).tolist()
    return (float(pose[0]), float(pose[1]), float(pose[2])), (q[0], q[1], q[2], q[3]), float(pose[6])
