"""End-effector poses [x, y, z, roll, pitch, yaw, gripper] and the actions between them, as
Meta's V-JEPA 2-AC code computes them (``notebooks/utils/mpc_utils.py``, ``app/vjepa_droid/droid.py``).

Angles are scipy's extrinsic "xyz" Euler angles: ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``; turning a
matrix back gives roll, yaw in [-pi, pi] and pitch in [-pi/2, pi/2] (the only wrapping there is).
- ``next_pose``: xyz + dxyz, ``R_new = R_delta @ R``, gripper clipped to [0, 1].
- ``pose_delta``: xyz_end - xyz_start, ``R_end @ R_start^T``, gripper_end - gripper_start.
Computed in float64 (the reference goes through numpy), returned in the input's dtype.
"""

from __future__ import annotations

import torch


def euler_to_matrix(angles: torch.Tensor) -> torch.Tensor:
    """[..., 3] extrinsic xyz angles -> [..., 3, 3] rotation matrices."""
    a = angles.double()
    cr, sr = a[..., 0].cos(), a[..., 0].sin()
    cp, sp = a[..., 1].cos(), a[..., 1].sin()
    cy, sy = a[..., 2].cos(), a[..., 2].sin()
    row0 = torch.stack([cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr], -1)
    row1 = torch.stack([sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr], -1)
    row2 = torch.stack([-sp, cp * sr, cp * cr], -1)
    return torch.stack([row0, row1, row2], -2)


def matrix_to_euler(m: torch.Tensor) -> torch.Tensor:
    """[..., 3, 3] -> [..., 3] extrinsic xyz angles (roll, yaw in [-pi, pi], pitch in [-pi/2, pi/2])."""
    m = m.double()
    pitch = torch.asin((-m[..., 2, 0]).clamp(-1.0, 1.0))
    roll = torch.atan2(m[..., 2, 1], m[..., 2, 2])
    yaw = torch.atan2(m[..., 1, 0], m[..., 0, 0])
    gimbal = m[..., 2, 0].abs() > 1.0 - 1e-9  # pitch at +-pi/2: roll and yaw turn about one axis
    if bool(gimbal.any()):  # then yaw is taken as 0 and the whole turn goes to roll
        locked_roll = torch.atan2(-torch.sign(m[..., 2, 0]) * m[..., 0, 1], m[..., 1, 1])
        roll = torch.where(gimbal, locked_roll, roll)
        yaw = torch.where(gimbal, torch.zeros_like(yaw), yaw)
    return torch.stack([roll, pitch, yaw], -1)


def next_pose(pose: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """[..., 7] pose after [..., 7] action."""
    p, a = pose.double(), action.double()
    xyz = p[..., :3] + a[..., :3]
    rot = euler_to_matrix(a[..., 3:6]) @ euler_to_matrix(p[..., 3:6])
    grip = (p[..., 6:] + a[..., 6:]).clamp(0.0, 1.0)
    return torch.cat([xyz, matrix_to_euler(rot), grip], -1).to(pose.dtype)


def pose_delta(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """The [..., 7] action that takes pose ``start`` to pose ``end``."""
    s, e = start.double(), end.double()
    rot = euler_to_matrix(e[..., 3:6]) @ euler_to_matrix(s[..., 3:6]).transpose(-1, -2)
    return torch.cat([e[..., :3] - s[..., :3], matrix_to_euler(rot), e[..., 6:] - s[..., 6:]], -1).to(start.dtype)


def quaternion_to_euler(q: torch.Tensor) -> torch.Tensor:
    """[..., 4] unit quaternions (x, y, z, w: geometry_msgs order) -> [..., 3] extrinsic xyz angles."""
    q = q.double()
    q = q / q.norm(dim=-1, keepdim=True)
    x, y, z, w = q.unbind(-1)
    m = torch.stack(
        [
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
            torch.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
            torch.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )
    return matrix_to_euler(m)


def euler_to_quaternion(angles: torch.Tensor) -> torch.Tensor:
    """[..., 3] extrinsic xyz angles -> [..., 4] unit quaternions (x, y, z, w)."""
    a = angles.double() / 2
    cr, sr = a[..., 0].cos(), a[..., 0].sin()
    cp, sp = a[..., 1].cos(), a[..., 1].sin()
    cy, sy = a[..., 2].cos(), a[..., 2].sin()
    return torch.stack(
        [
            sr * cp * cy - cr * sp * sy,
            cr * sp * cy + sr * cp * sy,
            cr * cp * sy - sr * sp * cy,
            cr * cp * cy + sr * sp * sy,
        ],
        -1,
    )
