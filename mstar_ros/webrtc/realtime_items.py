"""The Realtime API's items and a response's events, as OpenAI's WebRTC transport sends them.

Every turn of a peer's conversation is an item with an id, which clients use to delete or truncate it
(:class:`ItemIds`; the model's history holds plain tuples, so an item is found by its turn's identity).
Every answer is one output item, an assistant message with one audio content part; :class:`ResponseEvents`
sends its events in the order OpenAI's reference lists them: ``response.created``,
``response.output_item.added``, ``conversation.item.created``, ``response.content_part.added``,
``output_audio_buffer.started`` with the first audio, the transcript's deltas (with ``item_id``,
``output_index``, ``content_index``), then ``response.output_audio.done``,
``response.output_audio_transcript.done``, ``response.content_part.done``,
``response.output_item.done`` and ``response.done`` with ``output`` and ``usage``. The peer sends
``output_audio_buffer.stopped`` once the audio has played out, after ``response.done`` (OpenAI's order too).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mstar_ros.webrtc.events import EventError


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def message_item(item_id: str, role: str, content: list[dict], status: str = "completed") -> dict:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
        "content": content,
    }


MAX_LOOSE_ITEMS = 256  # items with no turn (answers of a model that keeps no conversation, cut-off ones) kept


@dataclass
class Item:
    turn: tuple | None  # its turn in the model's history (None: not in it, e.g. a model that keeps no conversation)
    role: str
    audio_ms: int = 0  # an answer's audio, what conversation.item.truncate may cut
    response_id: str | None = None  # the response that made it


class ItemIds:
    """The conversation's items by id; the turns they are in the model's history."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self.last: str | None = None  # the newest item: a new item's previous_item_id

    def add(self, item_id: str, turn: tuple | None, role: str, response_id: str | None = None) -> str | None:
        """Files the item; returns the id of the one before it."""
        previous, self.last = self.last, item_id
        self._items[item_id] = Item(turn, role, response_id=response_id)
        loose = [i for i, item in self._items.items() if item.turn is None]
        for old in loose[: max(0, len(loose) - MAX_LOOSE_ITEMS)]:
            self.remove(old)
        return previous

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    def get(self, item_id: Any) -> Item:
        if not isinstance(item_id, str) or item_id not in self._items:
            raise EventError(f"no item {item_id!r} in this conversation", param="item_id", code="item_not_found")
        return self._items[item_id]

    def remove(self, item_id: str) -> Item:
        item = self._items.pop(item_id)
        if self.last == item_id:
            self.last = next(reversed(self._items), None)
        return item

    def update(self, item_id: str | None, *, turn: tuple | None = None, audio_ms: int | None = None) -> None:
        """The item's turn (it joined the history, or was replaced) or audio; nothing if it is gone."""
        item = self._items.get(item_id) if item_id is not None else None
        if item is not None:
            item.turn = turn if turn is not None else item.turn
            item.audio_ms = audio_ms if audio_ms is not None else item.audio_ms

    def keep_only(self, history: list) -> None:
        """Forget the items whose turns left the history (trimmed past the conversation's limits)."""
        kept = {id(turn) for turn in history}
        for item_id in [i for i, item in self._items.items() if item.turn is not None and id(item.turn) not in kept]:
            self.remove(item_id)


def usage(model, request, text_tokens: int, audio_tokens: int) -> dict:
    """A response's ``usage`` as the Realtime API shapes it, counted as mstar_ros.webrtc.openai_usage counts
    (the request's prompt as submitted: a turn streamed in adds its audio's tokens later, uncounted)."""
    from mstar_ros.webrtc.openai_usage import placeholder_tokens, prompt_tokens

    prompt = prompt_tokens(request) if request is not None else 0
    audio_in = placeholder_tokens(model, request, "audio") if request is not None else 0
    image_in = placeholder_tokens(model, request, "image") if request is not None else 0
    out = text_tokens + audio_tokens
    return {
        "total_tokens": prompt + out,
        "input_tokens": prompt,
        "output_tokens": out,
        "input_token_details": {
            "text_tokens": prompt - audio_in - image_in,
            "audio_tokens": audio_in,
            "image_tokens": image_in,
            "cached_tokens": 0,
        },
        "output_token_details": {"text_tokens": text_tokens, "audio_tokens": audio_tokens},
    }


@dataclass
class ResponseEvents:
    """One response's output item and its events, sent through ``send(type, **fields)``."""

    send: Callable[..., None]
    response_id: str
    voice: str | None = None
    item_id: str = field(default_factory=lambda: new_id("item"))
    transcript: str = ""
    audio_started: bool = False

    @property
    def _at(self) -> dict:
        return {"response_id": self.response_id, "item_id": self.item_id, "output_index": 0, "content_index": 0}

    def _part(self) -> dict:
        return {"type": "audio", "transcript": self.transcript}

    def item(self, status: str) -> dict:
        content = [] if status == "in_progress" else [{"type": "output_audio", "transcript": self.transcript}]
        return message_item(self.item_id, "assistant", content, status)

    def response(self, status: str, output: list | None = None, **more: Any) -> dict:
        return {
            "object": "realtime.response",
            "id": self.response_id,
            "status": status,
            "output": output or [],
            "output_modalities": ["audio"],
            "audio": {"output": {"voice": self.voice}},
            **more,
        }

    def begin(self, previous_item_id: str | None) -> None:
        self.send("response.created", response=self.response("in_progress", status_details=None, usage=None))
        self.send(
            "response.output_item.added", response_id=self.response_id, output_index=0, item=self.item("in_progress")
        )
        self.send("conversation.item.created", previous_item_id=previous_item_id, item=self.item("in_progress"))
        self.send("response.content_part.added", **self._at, part=self._part())

    def audio(self) -> None:
        """Audio is going to the peer's track: the first time, output_audio_buffer.started."""
        if not self.audio_started:
            self.audio_started = True
            self.send("output_audio_buffer.started", response_id=self.response_id)

    def delta(self, text: str) -> None:
        if text:
            self.transcript += text
            self.send("response.output_audio_transcript.delta", **self._at, delta=text)

    def finish(self, status: str, usage: dict, reason: str | None = None, error: dict | None = None) -> None:
        """The done events: ``status`` completed, cancelled (``reason``: why) or failed (``error``)."""
        item_status = "completed" if status == "completed" else "incomplete"
        self.send("response.output_audio.done", **self._at)
        self.send("response.output_audio_transcript.done", **self._at, transcript=self.transcript)
        self.send("response.content_part.done", **self._at, part=self._part())
        item = self.item(item_status)
        self.send("response.output_item.done", response_id=self.response_id, output_index=0, item=item)
        details = None if status == "completed" else {"type": status, "reason": reason, "error": error}
        self.send("response.done", response=self.response(status, [item], status_details=details, usage=usage))
