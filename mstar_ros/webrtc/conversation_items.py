"""``conversation.item.create``: a message added to a peer's conversation, as the OpenAI Realtime API adds one.

``item``: ``{"type": "message", "role": "user" | "assistant" | "system", "content": [parts]}``; a part is
``{"type": "input_text", "text": ...}`` (``"text"`` for an assistant's), or, in a user message to a model
that takes images (``image_input``), ``{"type": "input_image", "image_url": "data:image/jpeg;base64,..."}``
(PNG, JPEG, WebP, GIF; nothing is fetched). The item joins the conversation the model sees on its next
turn, spoken or typed; ``response.create`` without text answers the conversation as it stands. Every
problem is an error naming the field; an image's declared size is checked before it is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mstar_ros.webrtc.events import EventError

MAX_ITEM_IMAGES = 4  # per item
MAX_ITEM_TEXT_CHARS = 2000


def turn_images(turn: tuple) -> list:
    """A history turn's images: (role, text, audio, images) has them, shorter turns none."""
    return list(turn[3]) if len(turn) > 3 else []


def image_pixels(image: Any) -> int:
    """An image's pixels: a decoded one's, or what a model's prepared image covers (its ``pixels``)."""
    pixels = getattr(image, "pixels", None)
    return int(pixels) if pixels is not None else image.width * image.height


def message_content(role: str, text: str, audio: bool = False) -> list[dict]:
    """A message's content parts as items show them: its audio (not echoed: the transcript is unknown), its text."""
    parts: list[dict[str, Any]] = [{"type": "input_audio", "transcript": None}] if audio else []
    if text:
        parts.append({"type": "input_text" if role != "assistant" else "text", "text": text})
    return parts


@dataclass
class ConversationItem:
    id: str
    role: str
    text: str
    images: list = field(default_factory=list)  # decoded PIL images
    prepared: list | None = None  # the same through the model's prepare_image, where it has one

    def history_turn(self) -> tuple:
        """The model's history entry: (role, text) or (role, text, no audio, images)."""
        images = self.prepared if self.prepared is not None else self.images
        return (self.role, self.text, None, images) if images else (self.role, self.text)

    def summary(self) -> dict:
        """The item as ``conversation.item.created`` echoes it: its images' sizes, not their bytes."""
        content: list[dict[str, Any]] = [
            {"type": "input_image", "width": im.width, "height": im.height} for im in self.images
        ]
        content += message_content(self.role, self.text)
        return {"id": self.id, "type": "message", "role": self.role, "status": "completed", "content": content}


def conversation_item(raw: Any, item_id: str, *, images_ok: bool, pixels_left: int | None = None) -> ConversationItem:
    """The event's ``item`` -> a checked item with its images opened, their pixels not yet decoded (base64 and
    header work: call it off the event loop). ``pixels_left``: what its images may hold together, checked
    against their declared sizes."""
    from mstar_ros.webrtc.media_parts import MAX_REQUEST_IMAGE_PIXELS, image_url, open_image

    if not isinstance(raw, dict):
        raise EventError("conversation.item.create needs an item object")
    if raw.get("type", "message") != "message":
        raise EventError(f"item.type {raw.get('type')!r}: only message items are taken")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise EventError(f"item.role {role!r}: user, assistant or system")
    content = raw.get("content")
    if not isinstance(content, list) or not content:
        raise EventError("item.content must be a non-empty list of parts")
    kinds = [part.get("type") if isinstance(part, dict) else None for part in content]
    pictures = [i for i, kind in enumerate(kinds) if kind == "input_image"]
    if pictures and (role != "user" or not images_ok):
        raise EventError(
            f"item.content[{pictures[0]}]: "
            + ("images are taken in user messages only" if images_ok else "this model takes no image input")
        )
    if len(pictures) > MAX_ITEM_IMAGES:  # counted before any is decoded
        raise EventError(f"item.content has {len(pictures)} images, over the limit of {MAX_ITEM_IMAGES} per item")
    texts, images = [], []
    limit = MAX_REQUEST_IMAGE_PIXELS if pixels_left is None else min(pixels_left, MAX_REQUEST_IMAGE_PIXELS)
    budget = [limit]
    for i, (part, kind) in enumerate(zip(content, kinds)):
        if kind in ("input_text", "text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise EventError(f"item.content[{i}].text must be a string")
            texts.append(text)
        elif kind == "input_image":
            try:
                images.append(open_image(image_url(part), budget, what="the conversation's images", limit=limit))
            except ValueError as exc:
                raise EventError(f"item.content[{i}]: {exc}") from None
        else:
            raise EventError(f"item.content[{i}].type {kind!r}: input_text" + (" or input_image" if images_ok else ""))
    text = " ".join(t for t in texts if t).strip()
    if len(text) > MAX_ITEM_TEXT_CHARS:
        raise EventError(f"item text of {len(text)} characters is over the {MAX_ITEM_TEXT_CHARS} limit")
    if not text and not images:
        raise EventError("an empty item: give text or an image")
    return ConversationItem(item_id, role, text, images)
