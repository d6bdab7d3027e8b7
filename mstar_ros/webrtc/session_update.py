"""``session.update``: what a peer's session may change, read from OpenAI's GA shape and its beta one.

GA: ``{"type": "realtime", "instructions", "output_modalities": ["audio"], "max_output_tokens",
"audio": {"input": {"format", "turn_detection", "transcription", "noise_reduction"}, "output": {"format",
"voice", "speed"}}}``; beta: ``voice``, ``modalities``, ``turn_detection``, ``input_audio_format``,
``output_audio_format``, ``max_response_output_tokens``. Our extensions: ``temperature``, ``top_p``,
``repetition_penalty``, ``seed``. A field the gateway cannot honour is an error naming it (``param``
``session.<path>``), never silently dropped; a value it honours anyway (``tools: []``, pcm16 at 24 kHz,
``speed`` 1) passes. Fields of the session a client may send back as it got them (``id``, ``object``,
``model`` when it names the served model) are taken as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mstar_ros.webrtc.events import EventError

PCM_24K = {"type": "audio/pcm", "rate": 24000}  # OpenAI's default input and output format
ECHOED = {"id", "object", "expires_at", "input_image", "random_weights", "output_audio_format"}  # ours, read-only
UNSET = object()


@dataclass
class SessionChange:
    """What an update changes; fields left at None (instructions: UNSET) keep their value."""

    voice: str | None = None
    instructions: Any = UNSET  # str, or None to drop them
    sampling: dict = field(default_factory=dict)  # SamplingParams field -> value
    silence_duration_ms: int | None = None
    vad_threshold: float | None = None
    turn_detection_off: bool = False  # turn_detection: null (a peer without a microphone track)


def _unsupported(path: str, why: str) -> EventError:
    return EventError(f"session.{path}: {why}", param=f"session.{path}", code="unsupported_value")


def _number(value: Any, path: str, integer: bool = False) -> float | int:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool):
        raise EventError(
            f"session.{path} must be {'an integer' if integer else 'a number'}, got {value!r}", param=f"session.{path}"
        )
    return value


def _format(value: Any, path: str) -> None:
    if value in ("pcm16", None) or (isinstance(value, dict) and {**PCM_24K, **value} == PCM_24K):
        return
    raise _unsupported(path, f"{value!r}: only pcm16 at 24 kHz ({PCM_24K}) is taken")


def _modalities(value: Any, path: str) -> None:
    if not isinstance(value, list) or "audio" not in value or not set(value) <= {"audio", "text"}:
        raise _unsupported(
            path, f'{value!r}: this gateway answers in audio with its transcript (["audio"]); text alone is not served'
        )


def _turn_detection(value: Any, path: str, change: SessionChange, has_microphone: bool) -> None:
    if value is None:
        if has_microphone:
            raise _unsupported(
                path,
                "null: the server VAD cuts the microphone's turns (input_audio_buffer.commit "
                "ends a turn of appended audio without it)",
            )
        change.turn_detection_off = True
        return
    if not isinstance(value, dict):
        raise EventError(f"session.{path} must be an object or null", param=f"session.{path}")
    for key, given in value.items():
        where = f"{path}.{key}"
        if key == "type":
            if given != "server_vad":
                raise _unsupported(where, f"{given!r}: only server_vad (silero-vad) is served")
        elif key == "silence_duration_ms":
            ms = _number(given, where, integer=True)
            if not 100 <= ms <= 10_000:
                raise EventError(f"session.{where} = {ms} must be in [100, 10000]", param=f"session.{where}")
            change.silence_duration_ms = int(ms)
        elif key == "threshold":
            threshold = _number(given, where)
            if not 0.0 < threshold < 1.0:
                raise EventError(f"session.{where} = {threshold} must be in (0, 1)", param=f"session.{where}")
            change.vad_threshold = float(threshold)
        elif key == "prefix_padding_ms":
            if given != 300:
                raise _unsupported(where, f"{given!r}: the VAD keeps 300 ms before a turn's start")
        elif key in ("create_response", "interrupt_response"):
            if given is not True:
                raise _unsupported(where, f"{given!r}: a turn is always answered, and speech always interrupts")
        elif key == "idle_timeout_ms":
            if given is not None:
                raise _unsupported(where, f"{given!r}: no idle timeout is served")
        else:
            raise _unsupported(where, "not a field this gateway serves")


def _audio(value: Any, change: SessionChange, has_microphone: bool, check_voice) -> None:
    if not isinstance(value, dict):
        raise EventError("session.audio must be an object", param="session.audio")
    for side, part in value.items():
        if side not in ("input", "output"):
            raise _unsupported(f"audio.{side}", "not a field this gateway serves")
        if not isinstance(part, dict):
            raise EventError(f"session.audio.{side} must be an object", param=f"session.audio.{side}")
        for key, given in part.items():
            path = f"audio.{side}.{key}"
            if key == "format":
                _format(given, path)
            elif side == "input" and key == "turn_detection":
                _turn_detection(given, path, change, has_microphone)
            elif side == "input" and key in ("transcription", "noise_reduction"):
                if given is not None:
                    raise _unsupported(path, f"{given!r}: not served (give null)")
            elif side == "output" and key == "voice":
                change.voice = check_voice(given, f"session.{path}")
            elif side == "output" and key == "speed":
                if _number(given, path) != 1:
                    raise _unsupported(path, f"{given!r}: the model speaks at its own speed (1.0)")
            else:
                raise _unsupported(path, "not a field this gateway serves")


def session_change(
    raw: Any, *, model_name: str, takes_instructions: bool, has_microphone: bool, check_voice, max_tokens_limit: int
) -> SessionChange:
    """``session.update``'s ``session`` -> the change it asks for, or the EventError naming its first field the
    gateway does not serve. ``check_voice(voice, param)`` returns the model's spelling or raises ValueError."""
    if raw is None:
        return SessionChange()
    if not isinstance(raw, dict):
        raise EventError("session must be an object", param="session")
    change = SessionChange()
    for key, given in raw.items():
        if key in ECHOED:
            continue
        if key == "type":
            if given != "realtime":
                raise _unsupported("type", f"{given!r}: this gateway serves realtime sessions only")
        elif key == "model":
            if given != model_name:
                raise _unsupported("model", f"{given!r}: this gateway serves {model_name!r}")
        elif key == "instructions":
            if not takes_instructions:
                raise _unsupported(
                    "instructions",
                    "this model speaks the text it is given and takes no "
                    "instructions (send the text in response.create)",
                )
            if given is not None and not isinstance(given, str):
                raise EventError("session.instructions must be a string", param="session.instructions")
            change.instructions = given.strip() or None if isinstance(given, str) else None
        elif key in ("output_modalities", "modalities"):
            _modalities(given, key)
        elif key == "audio":
            _audio(given, change, has_microphone, check_voice)
        elif key == "voice":
            change.voice = check_voice(given, "session.voice")
        elif key == "turn_detection":
            _turn_detection(given, key, change, has_microphone)
        elif key in ("input_audio_format", "output_audio_format"):
            _format(given, key)
        elif key in ("input_audio_transcription", "input_audio_noise_reduction", "tracing", "prompt"):
            if given is not None:
                raise _unsupported(key, f"{given!r}: not served (give null)")
        elif key in ("max_output_tokens", "max_response_output_tokens"):
            tokens = max_tokens_limit if given == "inf" else _number(given, key, integer=True)
            if not 1 <= tokens <= max_tokens_limit:
                raise EventError(f"session.{key} = {tokens} must be in [1, {max_tokens_limit}]", param=f"session.{key}")
            change.sampling["max_tokens"] = int(tokens)
        elif key == "tools":
            if given not in ([], None):
                raise _unsupported("tools", "this model calls no tools")
        elif key == "tool_choice":
            if given not in ("auto", "none", None):
                raise _unsupported("tool_choice", f"{given!r}: this model calls no tools")
        elif key == "truncation":
            if given not in ("auto", None):
                raise _unsupported(
                    "truncation", f"{given!r}: the oldest turns go first past the conversation's limits (auto)"
                )
        elif key == "include":
            if given not in ([], None):
                raise _unsupported("include", f"{given!r}: nothing more is included")
        elif key in ("temperature", "top_p", "repetition_penalty"):
            change.sampling[key] = float(_number(given, key))
        elif key == "seed":
            change.sampling["seed"] = None if given is None else int(_number(given, key, integer=True))
        else:
            raise _unsupported(key, "not a field this gateway serves")
    return change
