"""Data-channel events, named as the OpenAI Realtime API names them (server -> client and client -> server).

Server: ``session.created`` / ``updated``, ``input_audio_buffer.speech_started`` / ``speech_stopped`` /
``committed`` / ``cleared``, ``conversation.item.created`` / ``deleted`` / ``truncated``, a response's
events (mstar_ros.webrtc.realtime_items), ``output_audio_buffer.started`` / ``stopped`` / ``cleared``,
``error``. Client: ``response.create`` (the text to speak in ``response.instructions``, or ``text``;
``response.voice`` and ``response.max_output_tokens`` for this response only; a model that answers takes
it as the user's turn, or, without text, answers the conversation as it stands), ``response.cancel``,
``conversation.item.create`` (mstar_ros.webrtc.conversation_items) / ``delete`` / ``truncate``,
``input_audio_buffer.append`` / ``clear`` / ``commit`` (mstar_ros.webrtc.input_audio),
``output_audio_buffer.clear``, ``session.update`` (mstar_ros.webrtc.session_update).
Every client event is validated; a bad one gets an ``error`` event in OpenAI's shape (``error.type``,
``code``, ``message``, ``param``, ``event_id``) naming the field.
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


class ClientEvent(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    event_id: str | None = None
    response: ResponseSpec | None = None
    text: str | None = None  # a shorthand for response.instructions
    session: dict | None = None  # session.update's (checked by session_update, which names every field it lacks)
    item: dict | None = None  # conversation.item.create's message (checked by conversation_items)
    audio: str | None = None  # input_audio_buffer.append: base64 pcm16
    item_id: str | None = None  # conversation.item.delete / truncate
    content_index: int | None = None
    audio_end_ms: int | None = None


class EventError(ValueError):
    """A client event refused: ``param`` names the field at fault, ``code`` says why (OpenAI's error fields)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def error_body(
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    event_id: str | None = None,
    kind: str = "invalid_request_error",
) -> dict:
    """An ``error`` event's ``error``, as OpenAI's Realtime API shapes it."""
    return {"type": kind, "code": code, "message": message, "param": param, "event_id": event_id}


def parse_client_event(raw: str | bytes) -> ClientEvent:
    if len(raw) > MAX_ITEM_EVENT_BYTES:
        raise EventError(f"event of {len(raw)} bytes is over the {MAX_ITEM_EVENT_BYTES}-byte limit")
    try:
        event = decode_json(raw if isinstance(raw, bytes) else raw.encode(), ClientEvent, what="the event")
    except BadJSON as exc:
        raise EventError(f"not a valid event: {exc}") from None
    if len(raw) > MAX_EVENT_BYTES and event.type != "conversation.item.create":
        raise EventError(
            f"event of {len(raw)} bytes is over the {MAX_EVENT_BYTES}-byte limit "
            f"({MAX_ITEM_EVENT_BYTES} for conversation.item.create)"
        )
    return event


def response_text(event: ClientEvent, required: bool = True) -> str | None:
    """The text of ``response.create``; None where it has none and need not (a model answering its conversation)."""
    text = event.text if event.text is not None else (event.response.instructions if event.response else None)
    if not text or not text.strip():
        if not required:
            return None
        raise EventError("response.create needs the text to speak (response.instructions or text)")
    return text
