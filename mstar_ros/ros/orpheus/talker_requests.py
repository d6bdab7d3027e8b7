"""The Orpheus talker's text requests: its sampling defaults (ROS parameters) and the request factory.

A text request (mstar_ros.ros.partition.text_requests) may override the defaults per request
with the JSON fields SAMPLING_FIELDS names; the defaults themselves are the talker node's ROS
parameters, checked when set. The ``priority`` parameter is the class of its requests in the
runtime (mstar.priority; interactive unless set).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from mstar.priority import Priority
from mstar.sampling_params import SamplingParams

#: JSON request fields that override the node's sampling defaults
SAMPLING_FIELDS = {"max_tokens": int, "temperature": float, "top_p": float, "top_k": int, "repetition_penalty": float}


@dataclass
class SpeechDefaults:
    """What a text request gets unless its JSON says otherwise (the talker's ROS parameters)."""

    voice: str | None
    sampling: SamplingParams
    priority: Priority = Priority.INTERACTIVE  # a person waits for the speech


def bind_parameters(node, defaults: SpeechDefaults) -> None:
    """The defaults as ROS parameters of ``node``: ``--ros-args -p temperature:=0.3`` at start,
    ``ros2 param set /tts/orpheus_talker temperature 0.3`` while it runs (checked, or refused with why).
    ``priority`` (control, interactive, batch) is the class of the requests it makes from then on."""
    from rcl_interfaces.msg import SetParametersResult

    s = defaults.sampling
    initial = {
        "voice": defaults.voice or "",
        "temperature": s.temperature,
        "top_p": s.top_p,
        "repetition_penalty": s.repetition_penalty,
        "max_tokens": s.max_tokens,
        "priority": defaults.priority.label,
    }

    def apply(values: Mapping[str, object]) -> None:
        sampling = {k: v for k, v in values.items() if k not in ("voice", "priority")}
        updated = SamplingParams(**{**msgspec.structs.asdict(defaults.sampling), **sampling})  # validates
        named = values.get("priority")
        priority = defaults.priority if named is None else Priority.parse(str(named))  # ValueError: refused
        defaults.sampling, defaults.priority = updated, priority  # both or neither: a refused set changes nothing
        if "voice" in values:
            defaults.voice = str(values["voice"]) or None

    def on_set(params) -> SetParametersResult:
        try:
            apply({p.name: p.value for p in params if p.name in initial})
        except (ValueError, TypeError) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    for name, value in initial.items():
        node.declare_parameter(name, value)
    apply({name: node.get_parameter(name).value for name in initial})  # a params file or -p may have set them
    node.add_on_set_parameters_callback(on_set)


def request_factory(tokenizer, max_positions: int, defaults: SpeechDefaults):
    from mstar_graphs.orpheus.frontend import speech_request

    def build(text: str, request_id: str, seed: int, fields: Mapping[str, object]):
        unknown = sorted(set(fields) - set(SAMPLING_FIELDS))
        if unknown:
            raise ValueError(
                f"unknown request field(s) {unknown} (known: id, seed, text, {', '.join(SAMPLING_FIELDS)})"
            )
        overrides = {}
        for key, value in fields.items():
            kind = SAMPLING_FIELDS[key]
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or (kind is int and not isinstance(value, int))
            ):
                raise ValueError(f"{key} must be {kind.__name__}, got {value!r}")
            overrides[key] = kind(value)
        voice, base = defaults.voice, defaults.sampling
        try:
            sampling = SamplingParams(**{**msgspec.structs.asdict(base), **overrides, "seed": seed})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"sampling: {exc}") from None
        request = speech_request(tokenizer, max_positions, text, voice=voice, sampling=sampling, request_id=request_id)
        request.priority = defaults.priority
        return request

    return build
