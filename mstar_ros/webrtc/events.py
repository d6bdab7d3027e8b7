"""Data-channel events, named as the OpenAI Realtime API names them (server -> client and client -> server).

Server: ``session.created``, ``input_audio_buffer.speech_started`` / ``speech_stopped`` (with a
microphone), ``response.created``, ``response.output_audio_transcript.delta``,
``response.output_audio.done``, ``response.done``, ``error``. Client: ``response.create`` (the text to
speak in ``response.instructions``, or ``text``; ``response.voice`` and ``response.max_output_tokens``
for this response only; a model that answers takes it as the user's turn, or, without text, answers the
conversation as it stands), ``conversation.item.create`` (mstar_ros.webrtc.conversation_items), ``response.cancel``, ``session.update`` (``voice``, ``max_output_tokens``,
``turn_detection.silence_duration_ms``, and our extensions ``temperature``, ``top_p``,
``repetition_penalty``, ``seed``: the sampling of the peer's later responses).
Every client event is validated (msgspec); a bad one gets an ``error`` event naming the field.
"""
from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec

from mstar_ros.webrtc.json_body import BadJSON, decode_json

MAX_EVENT_BYTES = 64 * 1024
# an item may carry an image: up to the SCTP message size aiortc announces (a=max-message-size)
MAX_ITEM_EVENT_BYTES = 256 * 1024
_ids = itertools.count(1)


def event_id() -> str:
    return f"event_{next(_ids)}"


def server_event(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "event_id": event_id(), **fields})


class ResponseSpec(msgspec.Struct, forbid_unknown_fields=False):
    instructions: str | None = None
    voice: str | None = None
    max_output_tokens: int | None = None


class TurnDetection(msgspec.Struct, forbid_unknown_fields=False):
    type: str = "server_vad"
    silence_duration_ms: int | None = None


class SessionUpdate(msgspec.Struct, forbid_unknown_fields=False):
    """What ``session.update`` may change; fields left out keep their value."""
    voice: str | None = None
    max_output_tokens: int | None = None
    turn_detection: TurnDetection | None = None
    temperature: float | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None


class ClientEvent(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    event_id: str | None = None
    response: ResponseSpec | None = None
    text: str | None = None          # a shorthand for response.instructions
    session: SessionUpdate | None = None
    item: dict | None = None         # conversation.item.create's message (checked by conversation_items)


class EventError(ValueError):
    pass


def parse_client_event(raw: str | bytes) -> ClientEvent:
    if len(raw) > MAX_ITEM_EVENT_BYTES:
        raise EventError(f"event of {len(raw)} bytes is over the {MAX_ITEM_EVENT_BYTES}-byte limit")
    try:
        event = decode_json(raw if isinstance(raw, bytes) else raw.encode(), ClientEvent, what="the event")
    except BadJSON as exc:
        raise EventError(f"not a valid event: {exc}") from None
    if len(raw) > MAX_EVENT_BYTES and event.type != "conversation.item.create":
        raise EventError(f"event of {len(raw)} bytes is over the {MAX_EVENT_BYTES}-byte limit "
                         f"({MAX_ITEM_EVENT_BYTES} for conversation.item.create)")
    return event


def response_text(event: ClientEvent, required: bool = True) -> str | None:
    """The text of ``response.create``; None where it has none and need not (a model answering its conversation)."""
    text = event.text if event.text is not None else (event.response.instructions if event.response else None)
    if not text or not text.strip():
        if not required:
            return None
        raise EventError("response.create needs the text to speak (response.instructions or text)")
    return text
