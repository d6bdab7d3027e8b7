"""The BAGEL node's ROS parameters: declared, read once, validated (msgspec). Errors name the parameter at fault."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

#: name: (default, description)
PARAMETERS: dict[str, tuple[Any, str]] = {
    "camera_topic": (
        "camera/exterior/image_raw",
        "sensor_msgs/Image the questions and edits are about (rgb8, bgr8 or mono8)",
    ),
    "question_topic": ("bagel/question", "std_msgs/String: a question about the latest frame"),
    "answer_topic": ("bagel/answer", "std_msgs/String: each question's answer, in the order they finish"),
    "edit_topic": (
        "bagel/edit",
        "std_msgs/String: an instruction that edits the latest frame (e.g. 'the cup in the drawer')",
    ),
    "goal_topic": (
        "goal_image",
        "sensor_msgs/Image (rgb8) the edited frame is published on, stamped as its source frame (default: the "
        "topic the V-JEPA 2-AC world model reads its goal from)",
    ),
    "max_answer_tokens": (256, "most tokens in an answer"),
    "temperature": (0.0, "sampling temperature of answers (0: greedy, as the reference answers)"),
    "edit_steps": (50, "flow steps of an edit (the reference's: 50)"),
    "seed": (
        -1,
        "seed of every edit (-1: edit n of the node is seeded n): the same frame, text and seed give the same image",
    ),
    "match_frame_size": (
        True,
        "the edited image is resized to its source frame's size (else: the model's output size)",
    ),
    "max_frame_age_s": (2.0, "a request about a frame that arrived longer ago than this is refused (0: any age)"),
    "max_image_side": (4096, "a camera frame wider or higher than this is refused"),
    "max_text_chars": (2000, "a question or instruction longer than this is refused"),
    "max_pending": (
        4,
        "questions, and apart from them edits, this node holds at once (taken, not yet done); more are refused on "
        "arrival (the node is busy): a flood of either holds no more, and never takes the other's slots",
    ),
    "max_bad_rate_hz": (
        100.0,
        "a camera sending bad frames faster (over a quarter second) is unsubscribed for a while (5 s, doubling "
        "while it goes on; 0: never): a flood costs the node's other work nothing",
    ),
    "report_period_s": (5.0, "a repeated problem is reported once per this many seconds, with a count"),
    "priority": (
        "",
        "the priority class of this node's requests in the runtime (docs/scheduling.md): '' for each its own "
        "(questions interactive, edits batch), or control, interactive or batch for all of them",
    ),
}


class BagelParams(msgspec.Struct, frozen=True, kw_only=True):
    camera_topic: Annotated[str, msgspec.Meta(min_length=1)]
    question_topic: Annotated[str, msgspec.Meta(min_length=1)]
    answer_topic: Annotated[str, msgspec.Meta(min_length=1)]
    edit_topic: Annotated[str, msgspec.Meta(min_length=1)]
    goal_topic: Annotated[str, msgspec.Meta(min_length=1)]
    max_answer_tokens: Annotated[int, msgspec.Meta(ge=1, le=65536)]
    temperature: Annotated[float, msgspec.Meta(ge=0)]
    edit_steps: Annotated[int, msgspec.Meta(ge=2)]
    seed: Annotated[int, msgspec.Meta(ge=-1)]
    match_frame_size: bool
    max_frame_age_s: Annotated[float, msgspec.Meta(ge=0)]
    max_image_side: Annotated[int, msgspec.Meta(ge=1)]
    max_text_chars: Annotated[int, msgspec.Meta(ge=1)]
    max_pending: Annotated[int, msgspec.Meta(ge=1)]
    max_bad_rate_hz: Annotated[float, msgspec.Meta(ge=0)]
    report_period_s: Annotated[float, msgspec.Meta(ge=0)]
    priority: Literal["", "control", "interactive", "batch"]


def validate(values: dict[str, Any], where: str, max_steps: int | None = None) -> BagelParams:
    """``values`` (every parameter's) as BagelParams, or a ValueError naming ``where`` and the parameter."""
    try:
        p = msgspec.convert(values, BagelParams)
    except msgspec.ValidationError as exc:
        msg, _, path = str(exc).partition(" - at `$.")
        raise ValueError(f"{where}: parameter {path.rstrip('`') or '?'}: {msg}") from None
    if max_steps is not None and p.edit_steps > max_steps:
        raise ValueError(f"{where}: parameter edit_steps: {p.edit_steps} is over the model's {max_steps}")
    if 0 < p.max_bad_rate_hz < 4:
        raise ValueError(
            f"{where}: parameter max_bad_rate_hz: {p.max_bad_rate_hz:g} would cut the camera at its first bad "
            "frame (it is counted over a quarter second): give 0 (never) or at least 4"
        )
    topics = {
        "camera_topic": p.camera_topic,
        "question_topic": p.question_topic,
        "answer_topic": p.answer_topic,
        "edit_topic": p.edit_topic,
        "goal_topic": p.goal_topic,
    }
    names = list(topics.values())
    dupes = sorted(name for name, topic in topics.items() if names.count(topic) > 1)
    if dupes:
        raise ValueError(f"{where}: parameters {', '.join(dupes)}: the same topic given for more than one")
    return p


def declare(node, max_steps: int | None = None) -> BagelParams:
    """Declares every parameter on ``node`` and returns them validated."""
    for name, (default, _) in PARAMETERS.items():
        node.declare_parameter(name, default)
    values = {name: node.get_parameter(name).value for name in PARAMETERS}
    return validate(values, node.get_fully_qualified_name(), max_steps)
