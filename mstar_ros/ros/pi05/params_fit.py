"""Do a robot's policy parameters fit the checkpoint? Joints against its state, actions against its actions.

``joint_names`` are the state (the checkpoint's ``observation.state`` or state statistics);
the action names (``action_names``, or the joints) are its actions (``output_features``
or action statistics). A checkpoint without statistics is scaled by the joint limits, which
fit joint positions only. Each error names the parameter at fault and the checkpoint.
"""

from __future__ import annotations

from mstar_ros.ros.pi05.params import PolicyParams


def check_fits(p: PolicyParams, policy, where: str) -> None:
    """ValueError unless ``p`` fits ``policy`` (a mstar_graphs.pi05.frontend.Pi05Policy)."""
    layout = policy.layout
    joints, actions = len(p.joint_names), len(p.actions)
    named, what = ("action_names", "names") if p.action_names else ("joint_names", "joints")
    if layout.action_dim is not None and actions != layout.action_dim:
        hint = "" if p.action_names else " (set action_names for actions that are not the state's joints)"
        raise ValueError(
            f"{where}: parameter {named}: {actions} {what}, but the checkpoint's actions have "
            f"{layout.action_dim} dims ({policy.path}){hint}"
        )
    if actions > policy.action_dim:
        raise ValueError(
            f"{where}: parameter {named}: {actions} {what}, but the model acts in {policy.action_dim} dims"
        )
    if layout.state_dim is not None and joints != layout.state_dim:
        raise ValueError(
            f"{where}: parameter joint_names: {joints} joints, but the checkpoint's state has "
            f"{layout.state_dim} dims ({policy.path})"
        )
    if layout.normalization is None and (p.action_space != "joint_positions" or p.actions != list(p.joint_names)):
        field = "action_space" if p.action_space != "joint_positions" else "action_names"
        raise ValueError(
            f"{where}: parameter {field}: the checkpoint has no normalisation statistics, so its actions "
            f"would be scaled by joint_lower / joint_upper, which fit only the positions of joint_names "
            f"({policy.path})"
        )
