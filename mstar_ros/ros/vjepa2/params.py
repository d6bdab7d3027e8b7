"""The V-JEPA 2-AC world-model node's ROS parameters: declared, read once, validated (msgspec).
Errors name the parameter at fault."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

#: name: (default, description)
PARAMETERS: dict[str, tuple[Any, str]] = {
    "camera_topic": ("camera/exterior/image_raw", "sensor_msgs/Image the model sees (rgb8, bgr8 or mono8)"),
    "pose_topic": ("ee_pose", "geometry_msgs/PoseStamped: the end effector in the robot base frame"),
    "gripper_topic": ("gripper/joint_states", "sensor_msgs/JointState with the gripper joint"),
    "gripper_joint": ("robotiq_85_left_knuckle_joint", "the gripper joint in gripper_topic"),
    "gripper_max": (1.0, "gripper position that means closed (state = position / gripper_max, in [0, 1])"),
    "goal_topic": ("goal_image", "sensor_msgs/Image of the goal: starts or updates planning"),
    "fps": (4.0, "frames per second that extend the session (the rate the model was trained at: 4)"),
    "image_height": (
        0,
        "expected camera image height (0: the camera's first frame's size, logged; frames of "
        "another size are reported and dropped)",
    ),
    "image_width": (0, "expected camera image width (0: the first frame's, with image_height 0)"),
    "max_pose_age_s": (0.25, "a frame whose nearest pose or gripper reading is older than this is not used"),
    "max_observation_age_s": (
        0.5,
        "camera, pose or gripper messages stamped more than this before or after this "
        "node's clock are refused (a lagging driver, a replayed stamp, clocks out of "
        "step)",
    ),
    "max_position_m": (10.0, "a pose with x, y or z farther than this from the base frame's origin is refused"),
    "max_bad_rate_hz": (
        100.0,
        "a sensor topic sending bad messages faster (over a quarter second) is unsubscribed "
        "for a while (5 s, doubling while it goes on; 0: never): a flood costs others nothing",
    ),
    "seed": (
        -1,
        "seed of every plan's CEM sampling: the same seed, frames, poses and goal give the same plan "
        "(-1: plan n of the node is seeded n; /diagnostics says each plan's seed)",
    ),
    "window_frames": (
        0,
        "frames the session keeps (0: the model's capacity less the plan horizon); when full "
        "it keeps its newest half, computed again exactly",
    ),
    "plan_horizon": (2, "actions per plan (Meta's world-model wrapper: 2)"),
    "plan_samples": (64, "CEM samples per iteration (Meta: 400)"),
    "plan_topk": (8, "CEM elite samples (Meta: 10)"),
    "plan_iterations": (3, "CEM iterations per plan (Meta: 10)"),
    "plan_maxnorm": (0.05, "largest xyz step of an action (m)"),
    "plan_momentum_mean": (0.15, "CEM momentum of the mean (xyz)"),
    "plan_momentum_std": (0.15, "CEM momentum of the std (xyz)"),
    "frame_id": ("", "frame of the published plan poses ('': the pose topic's)"),
    "report_period_s": (5.0, "a repeated problem is reported once per this many seconds, with a count"),
    "priority": (
        "control",
        "the priority class of this node's frames, goals and plans in the runtime: control (served "
        "first), interactive or batch (docs/scheduling.md)",
    ),
}


class WorldModelParams(msgspec.Struct, frozen=True, kw_only=True):
    camera_topic: Annotated[str, msgspec.Meta(min_length=1)]
    pose_topic: Annotated[str, msgspec.Meta(min_length=1)]
    gripper_topic: Annotated[str, msgspec.Meta(min_length=1)]
    gripper_joint: Annotated[str, msgspec.Meta(min_length=1)]
    gripper_max: Annotated[float, msgspec.Meta(gt=0)]
    goal_topic: Annotated[str, msgspec.Meta(min_length=1)]
    fps: Annotated[float, msgspec.Meta(gt=0)]
    image_height: Annotated[int, msgspec.Meta(ge=0)]
    image_width: Annotated[int, msgspec.Meta(ge=0)]
    max_pose_age_s: Annotated[float, msgspec.Meta(gt=0)]
    max_observation_age_s: Annotated[float, msgspec.Meta(gt=0)]
    max_position_m: Annotated[float, msgspec.Meta(gt=0, le=1e6)]
    max_bad_rate_hz: Annotated[float, msgspec.Meta(ge=0)]
    seed: Annotated[int, msgspec.Meta(ge=-1)]
    window_frames: Annotated[int, msgspec.Meta(ge=0)]
    plan_horizon: Annotated[int, msgspec.Meta(ge=1)]
    plan_samples: Annotated[int, msgspec.Meta(ge=2)]
    plan_topk: Annotated[int, msgspec.Meta(ge=2)]
    plan_iterations: Annotated[int, msgspec.Meta(ge=1)]
    plan_maxnorm: Annotated[float, msgspec.Meta(gt=0)]
    plan_momentum_mean: Annotated[float, msgspec.Meta(ge=0, le=1)]
    plan_momentum_std: Annotated[float, msgspec.Meta(ge=0, le=1)]
    frame_id: str
    report_period_s: Annotated[float, msgspec.Meta(ge=0)]
    priority: Literal["control", "interactive", "batch"]

    @property
    def expect_hw(self) -> tuple[int, int] | None:
        return (self.image_height, self.image_width) if self.image_height and self.image_width else None


def declare(node, max_frames: int) -> WorldModelParams:
    """Declares every parameter on ``node`` and returns them validated against the model."""
    where = node.get_fully_qualified_name()
    for name, (default, _) in PARAMETERS.items():
        node.declare_parameter(name, default)
    values = {name: node.get_parameter(name).value for name in PARAMETERS}
    try:
        p = msgspec.convert(values, WorldModelParams)
    except msgspec.ValidationError as exc:
        msg, _, path = str(exc).partition(" - at `$.")
        raise ValueError(f"{where}: parameter {path.rstrip('`') or '?'}: {msg}") from None
    if p.plan_topk > p.plan_samples:
        raise ValueError(f"{where}: parameter plan_topk: {p.plan_topk} is more than plan_samples={p.plan_samples}")
    if p.plan_horizon >= max_frames:
        raise ValueError(
            f"{where}: parameter plan_horizon: {p.plan_horizon} leaves no room for a frame in the "
            f"model's {max_frames}-frame context"
        )
    if p.window_frames and p.window_frames + p.plan_horizon > max_frames:
        raise ValueError(
            f"{where}: parameter window_frames: {p.window_frames} + plan_horizon {p.plan_horizon} is "
            f"over the model's {max_frames}-frame context"
        )
    if bool(p.image_height) != bool(p.image_width):
        raise ValueError(
            f"{where}: parameters image_height and image_width: give both or neither (0 and 0: the "
            "camera's first frame's size)"
        )
    if 0 < p.max_bad_rate_hz < 4:
        raise ValueError(
            f"{where}: parameter max_bad_rate_hz: {p.max_bad_rate_hz:g} would cut a topic at its first "
            "bad message (it is counted over a quarter second): give 0 (never) or at least 4"
        )
    topics = [p.camera_topic, p.pose_topic, p.gripper_topic, p.goal_topic]
    dupes = sorted({t for t in topics if topics.count(t) > 1})
    if dupes:
        raise ValueError(f"{where}: topic parameters: {dupes} given for more than one input")
    return p
