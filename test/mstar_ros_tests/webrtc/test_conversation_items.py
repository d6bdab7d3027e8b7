"""conversation.item.create's items: text and images checked and decoded, with errors that name the field;
the event size and nesting limits."""

from __future__ import annotations

import base64
import io
import json

import pytest

from mstar_ros.webrtc.conversation_items import MAX_ITEM_IMAGES, conversation_item
from mstar_ros.webrtc.events import MAX_EVENT_BYTES, MAX_ITEM_EVENT_BYTES, EventError, parse_client_event
from support.images import bomb_png, picture


def data_url(raw: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(raw).decode()


def png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def message(*content, role: str = "user") -> dict:
    return {"type": "message", "role": role, "content": list(content)}


def test_an_item_with_text_and_an_image_decodes_them_and_echoes_sizes_not_bytes():
    shown = picture(48, 30, 1)
    item = conversation_item(
        message(
            {"type": "input_image", "image_url": data_url(png(shown))},
            {"type": "input_text", "text": " what is this? "},
        ),
        "item_1",
        images_ok=True,
    )
    assert item.role == "user" and item.text == "what is this?"
    assert [im.size for im in item.images] == [(48, 30)] and item.images[0].tobytes() == shown.tobytes()
    assert item.history_turn() == ("user", "what is this?", None, item.images)
    assert item.summary() == {
        "id": "item_1",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [
            {"type": "input_image", "width": 48, "height": 30},
            {"type": "input_text", "text": "what is this?"},
        ],
    }
    said = conversation_item(
        message({"type": "text", "text": "It is a colour field."}, role="assistant"), "i2", images_ok=True
    )
    assert said.history_turn() == ("assistant", "It is a colour field.")


@pytest.mark.parametrize(
    "item, images_ok, error",
    [
        (None, True, "needs an item object"),
        ({"type": "function_call"}, True, "item.type 'function_call'"),
        (message({"type": "input_text", "text": "hi"}, role="tool"), True, "item.role 'tool'"),
        (message(), True, "non-empty list"),
        (message({"type": "input_text", "text": "   "}), True, "an empty item"),
        (message({"type": "input_text", "text": 5}), True, r"item.content\[0\].text must be a string"),
        (message({"type": "input_audio", "audio": ""}), True, r"item.content\[0\].type 'input_audio'"),
        (message({"type": "input_image", "image_url": "data:image/png;base64,AA=="}), False, "takes no image input"),
        (
            message({"type": "input_image", "image_url": "data:image/png;base64,AA=="}, role="assistant"),
            True,
            r"item.content\[0\]: images are taken in user messages only",
        ),
        (
            message(
                {"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "https://example.com/a.png"}
            ),
            True,
            r"item.content\[1\]: image_url.url must be a data: URL",
        ),
        (message({"type": "input_image", "image_url": "data:image/png;base64,!!"}), True, "not valid base64"),
        (message({"type": "input_image", "image_url": data_url(b"GIF89a but not really")}), True, "not a readable"),
        (
            message({"type": "input_image", "image_url": data_url(bomb_png(9_000, 8_000))}),
            True,
            "9000 x 8000 = 72000000 pixels, over the limit",
        ),
        (
            message(*[{"type": "input_image", "image_url": "data:,"}] * (MAX_ITEM_IMAGES + 1)),
            True,
            f"over the limit of {MAX_ITEM_IMAGES} per item",
        ),
        (message({"type": "input_text", "text": "x" * 2001}), True, "2001 characters is over the 2000 limit"),
    ],
)
def test_a_bad_item_is_an_error_that_names_the_problem(item, images_ok, error):
    with pytest.raises(EventError, match=error):
        conversation_item(item, "item_x", images_ok=images_ok)


def test_an_item_event_may_carry_an_image_up_to_the_sctp_message_size_and_others_stay_small():
    big = "x" * (MAX_EVENT_BYTES + 10)
    item = json.dumps({"type": "conversation.item.create", "item": message({"type": "input_text", "text": big})})
    assert parse_client_event(item).item["content"][0]["text"] == big
    with pytest.raises(EventError, match=f"over the {MAX_EVENT_BYTES}-byte limit"):
        parse_client_event(json.dumps({"type": "response.create", "text": big}))
    with pytest.raises(EventError, match=f"over the {MAX_ITEM_EVENT_BYTES}-byte limit"):
        parse_client_event(json.dumps({"type": "conversation.item.create", "item": {"x": "y" * MAX_ITEM_EVENT_BYTES}}))
    with pytest.raises(EventError, match="nested too deeply"):  # msgspec's RecursionError, named as the rest
        parse_client_event('{"type": "conversation.item.create", "item": {"a": ' + "[" * 50_000 + "]" * 50_000 + "}}")


def test_an_item_s_images_share_the_pixels_left_for_them():
    part = {"type": "input_image", "image_url": data_url(png(picture(40, 30, 2)))}
    assert len(conversation_item(message(part, part), "i", images_ok=True, pixels_left=2400).images) == 2
    with pytest.raises(EventError, match=r"item.content\[1\]: the conversation's images are over 2000 pixels"):
        conversation_item(message(part, part), "i", images_ok=True, pixels_left=2000)
