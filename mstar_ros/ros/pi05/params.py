"""The pi0.5 policy node's ROS parameters: declared on the node, read once, validated (msgspec).

Cameras are the checkpoint's: one parameter ``cameras.<name>`` per camera its config names
(``observation.images.<name>``), in the model's order, each a topic, or ``""`` for a camera
this robot does not have (left out, as the references mask a missing camera). A camera
without a topic, a name the checkpoint does not have, or the old list form is an error at
start that names the fix. Errors name the parameter at fault.

The actions are the state's joints by default (``joint_names``, positions, as a
JointTrajectory). A checkpoint whose actions are something else (LIBERO: an 8-d state, 7-d
end-effector deltas + gripper) names them in ``action_names`` and says what they are in
``action_space``: joint positions or joint velocities (a JointTrajectory's points' positions
or velocities) or any other space (a ``std_msgs/Float32MultiArray`` whose layout carries the
names).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

#: name: (default, description); None: no default (declared by type, unset unless given)
PARAMETERS: dict[str, tuple[Any, str]] = {
    "joint_states_topic": ("joint_states", "sensor_msgs/JointState topic"),
    "joint_names": (
        [f"panda_joint{i}" for i in range(1, 8)] + ["robotiq_85_left_knuckle_joint"],
        "joints the policy reads (the state, in the checkpoint's order) and, unless action_names says "
        "otherwise, commands",
    ),
    "action_names": (
        None,
        "the action dims in the checkpoint's order: joints for joint_positions / "
        "joint_velocities, labels for labelled_array (unset or []: joint_names)",
    ),
    "action_space": (
        "joint_positions",
        "what the actions are and how they go out on action_chunk: "
        "joint_positions / joint_velocities (trajectory_msgs/JointTrajectory points' "
        "positions / velocities) or labelled_array (std_msgs/Float32MultiArray "
        "[time, action], the names in its layout)",
    ),
    "joint_lower": (
        None,
        "lower joint limits: positions outside are reported; the state/action scaling only for "
        "a checkpoint without normalisation statistics",
    ),
    "joint_upper": (None, "upper joint limits (see joint_lower)"),
    "prompt": ("pick up the object", "the task, in words (also settable on the 'prompt' topic)"),
    "control_rate_hz": (15.0, "actions per second the robot executes (JointTrajectory point spacing)"),
    "refill_at": (0, "request the next chunk when this many actions are left (0: half the horizon)"),
    "smooth": (True, "real-time chunking: inpaint the actions that run while a chunk is computed"),
    "image_height": (224, "expected camera image height (other sizes are reported and dropped)"),
    "image_width": (224, "expected camera image width"),
    "max_observation_age_s": (0.5, "do not act on camera or joint data older than this, by header.stamp or arrival"),
    "sensor_timeout_s": (1.0, "no fresh data from a sensor for this long is a sensor loss (see on_sensor_loss)"),
    "on_sensor_loss": (
        "hold",
        "hold: publish an empty JointTrajectory (controllers stop and hold) and drop the "
        "chunk; continue: let the robot finish its chunk. Either way /diagnostics says ERROR",
    ),
    "wait_for_fresh_frames": (
        True,
        "when a chunk falls due late in a camera frame's life, wait (at most one "
        "frame period) for the next frame: a fresher observation for less wait",
    ),
    "max_prompt_bytes": (4096, "longer prompts (UTF-8 bytes) are refused; the previous prompt is kept"),
    "max_prompt_tokens": (
        0,
        "prompts of more tokens (before the state) are refused (0: the checkpoint's tokenizer_max_length)",
    ),
    "chunk_timeout_s": (
        0.0,
        "a chunk not back this long after its request is overdue: the robot holds (empty "
        "action message) and /diagnostics says ERROR until chunks come again, as when a Worker "
        "is down (0: one chunk's duration, horizon / control_rate_hz)",
    ),
    "report_period_s": (5.0, "a repeated problem is reported once per this many seconds, with a count"),
    "priority": (
        "control",
        "the priority class of this robot's chunks in the runtime: control (served first), "
        "interactive or batch (docs/scheduling.md)",
    ),
    "max_bad_rate_hz": (
        100.0,
        "a sensor topic sending bad messages faster (over a quarter second) is unsubscribed "
        "for a while (5 s, doubling while it goes on; 0: never): a flood costs others nothing",
    ),
}
#: parameters typed, without a default (rclpy cannot tell an empty list's type)
_ARRAYS = {"joint_lower": "DOUBLE_ARRAY", "joint_upper": "DOUBLE_ARRAY", "action_names": "STRING_ARRAY"}
ActionSpace = Literal["joint_positions", "joint_velocities", "labelled_array"]


class PolicyParams(msgspec.Struct, frozen=True, kw_only=True):
    cameras: dict[str, str]  # checkpoint camera -> topic ("" : not on this robot)
    joint_states_topic: Annotated[str, msgspec.Meta(min_length=1)]
    joint_names: Annotated[list[str], msgspec.Meta(min_length=1)]
    joint_lower: list[float]
    joint_upper: list[float]
    action_names: list[str]
    action_space: ActionSpace
    prompt: str
    control_rate_hz: Annotated[float, msgspec.Meta(gt=0)]
    refill_at: Annotated[int, msgspec.Meta(ge=0)]
    smooth: bool
    image_height: Annotated[int, msgspec.Meta(gt=0)]
    image_width: Annotated[int, msgspec.Meta(gt=0)]
    max_observation_age_s: Annotated[float, msgspec.Meta(gt=0)]
    sensor_timeout_s: Annotated[float, msgspec.Meta(gt=0)]
    on_sensor_loss: Literal["hold", "continue"]
    wait_for_fresh_frames: bool
    max_prompt_bytes: Annotated[int, msgspec.Meta(gt=0)]
    max_prompt_tokens: Annotated[int, msgspec.Meta(ge=0)]
    report_period_s: Annotated[float, msgspec.Meta(ge=0)]
    max_bad_rate_hz: Annotated[float, msgspec.Meta(ge=0)]
    chunk_timeout_s: Annotated[float, msgspec.Meta(ge=0)]
    priority: Literal["control", "interactive", "batch"]

    @property
    def actions(self) -> list[str]:
        """The names of the action dims: ``action_names``, or the joints when it is not set."""
        return list(self.action_names or self.joint_names)

    @property
    def camera_topics(self) -> dict[str, str]:
        """The cameras this robot has, in the model's order: name -> topic."""
        return {name: topic for name, topic in self.cameras.items() if topic}


def declare(
    node, cameras: Sequence[str], placeholders: Sequence[str] = (), overrides: dict[str, Any] | None = None
) -> PolicyParams:
    """Declares every parameter on ``node`` (``overrides`` replace defaults; a params file or ``-p``
    still wins) and returns them validated. ValueError names the parameter at fault."""
    from rclpy.parameter import Parameter

    where = node.get_fully_qualified_name()
    given = set(getattr(node, "_parameter_overrides", {}))  # what the params file / -p set
    if "cameras" in given:
        raise ValueError(
            f"{where}: 'cameras' is one parameter per camera of the checkpoint now: "
            + ", ".join(f"cameras.{c}: TOPIC" for c in cameras)
            + " ('' for a camera the robot lacks)"
        )
    known = {f"cameras.{c}" for c in cameras}
    for name in sorted(n for n in given if n.startswith("cameras.") and n not in known):
        camera = name.removeprefix("cameras.")
        why = (
            "a placeholder the checkpoint always masks" if camera in placeholders else "not a camera of this checkpoint"
        )
        raise ValueError(f"{where}: parameter {name}: {camera!r} is {why} (its cameras: {', '.join(cameras)})")
    defaults = {name: default for name, (default, _) in PARAMETERS.items()}
    defaults.update(overrides or {})
    values: dict[str, Any] = {}
    for name, default in defaults.items():
        if default is None and name in _ARRAYS:
            node.declare_parameter(name, getattr(Parameter.Type, _ARRAYS[name]))
        else:
            node.declare_parameter(name, default)
    for name in defaults:
        values[name] = _value(node, name)
    topics = {}
    for camera in cameras:
        node.declare_parameter(f"cameras.{camera}", Parameter.Type.STRING)
        topics[camera] = _value(node, f"cameras.{camera}")
    unset = [c for c, t in topics.items() if t is None]
    if unset:
        raise ValueError(
            f"{where}: no topic for camera(s) {unset} of the checkpoint: set "
            + ", ".join(f"cameras.{c}" for c in unset)
            + " to a topic, or to '' if the robot has none"
        )
    if not any(topics.values()):
        raise ValueError(f"{where}: every camera parameter is '': the policy needs at least one camera")
    values["cameras"] = topics
    for name in _ARRAYS:
        values[name] = list(values[name] or [])
    try:
        params = msgspec.convert(values, PolicyParams)
    except msgspec.ValidationError as exc:
        msg, _, path = str(exc).partition(" - at `$.")
        field = path.rstrip("`")
        choices = typing.get_args(typing.get_type_hints(PolicyParams).get(field.split(".")[0]))
        if choices and all(isinstance(c, str) for c in choices):
            msg += f" (one of {', '.join(choices)})"
        raise ValueError(f"{where}: parameter {field or '?'}: {msg}") from None
    return _checked(params, where)


def _value(node, name: str) -> Any:
    from rclpy.exceptions import ParameterUninitializedException

    try:
        return node.get_parameter(name).value
    except ParameterUninitializedException:
        return None


def _checked(p: PolicyParams, where: str) -> PolicyParams:
    dupes = sorted({n for n in p.joint_names if p.joint_names.count(n) > 1})
    if dupes:
        raise ValueError(f"{where}: parameter joint_names: {dupes} appear more than once")
    dupes = sorted({n for n in p.action_names if p.action_names.count(n) > 1})
    if dupes:
        raise ValueError(f"{where}: parameter action_names: {dupes} appear more than once")
    if p.action_space == "labelled_array" and any("," in n or not n for n in p.actions):
        raise ValueError(
            f"{where}: parameter action_names: {p.actions} (labelled_array joins the names with commas "
            "in its layout: give names without commas, none empty)"
        )
    for name in ("joint_lower", "joint_upper"):
        values = getattr(p, name)
        if values and len(values) != len(p.joint_names):
            raise ValueError(f"{where}: parameter {name}: {len(values)} values for {len(p.joint_names)} joint_names")
    if bool(p.joint_lower) != bool(p.joint_upper):
        raise ValueError(f"{where}: parameters joint_lower and joint_upper: give both or neither")
    if not p.prompt.strip():
        raise ValueError(f"{where}: parameter prompt: empty")
    if p.sensor_timeout_s < p.max_observation_age_s:
        raise ValueError(
            f"{where}: parameter sensor_timeout_s: {p.sensor_timeout_s:g} is under "
            f"max_observation_age_s={p.max_observation_age_s:g} (data would be acted on after the robot "
            "was stopped for having none)"
        )
    if 0 < p.max_bad_rate_hz < 4:
        raise ValueError(
            f"{where}: parameter max_bad_rate_hz: {p.max_bad_rate_hz:g} would cut a topic at its first "
            "bad message (it is counted over a quarter second): give 0 (never) or at least 4"
        )
    topics = [*p.camera_topics.values(), p.joint_states_topic]
    dupes = sorted({t for t in topics if topics.count(t) > 1})
    if dupes:
        raise ValueError(f"{where}: parameters cameras.* / joint_states_topic: {dupes} given for more than one sensor")
    return p
