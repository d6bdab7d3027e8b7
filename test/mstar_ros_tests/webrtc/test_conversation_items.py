"""conversation.item.create's items: text and images checked and decoded, with errors that name the field;
the event size and nesting limits; a peer's conversation trimmed past its limits (system turns kept, the rest
starting at a user turn), and an answer filed right after the item it answered."""
from __future__ import annotations

import base64
import io
import json

import pytest

from mstar_ros.webrtc.conversation_items import MAX_ITEM_IMAGES, conversation_item
from mstar_ros.webrtc.events import MAX_EVENT_BYTES, MAX_ITEM_EVENT_BYTES, EventError, parse_client_event
from mstar_ros.webrtc.peer import VoicePeer
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
    item = conversation_item(message({"type": "input_image", "image_url": data_url(png(shown))},
                                     {"type": "input_text", "text": " what is this? "}), "item_1", images_ok=True)
    assert item.role == "user" and item.text == "what is this?"
    assert [im.size for im in item.images] == [(48, 30)] and item.images[0].tobytes() == shown.tobytes()
    assert item.history_turn() == ("user", "what is this?", None, item.images)
    assert item.summary() == {"id": "item_1", "type": "message", "role": "user", "status": "completed",
                              "content": [{"type": "input_image", "width": 48, "height": 30},
                                          {"type": "input_text", "text": "what is this?"}]}
    said = conversation_item(message({"type": "text", "text": "It is a colour field."}, role="assistant"), "i2",
                             images_ok=True)
    assert said.history_turn() == ("assistant", "It is a colour field.")


@pytest.mark.parametrize("item, images_ok, error", [
    (None, True, "needs an item object"),
    ({"type": "function_call"}, True, "item.type 'function_call'"),
    (message({"type": "input_text", "text": "hi"}, role="tool"), True, "item.role 'tool'"),
    (message(), True, "non-empty list"),
    (message({"type": "input_text", "text": "   "}), True, "an empty item"),
    (message({"type": "input_text", "text": 5}), True, r"item.content\[0\].text must be a string"),
    (message({"type": "input_audio", "audio": ""}), True, r"item.content\[0\].type 'input_audio'"),
    (message({"type": "input_image", "image_url": "data:image/png;base64,AA=="}), False, "takes no image input"),
    (message({"type": "input_image", "image_url": "data:image/png;base64,AA=="}, role="assistant"), True,
     r"item.content\[0\]: images are taken in user messages only"),
    (message({"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": "https://example.com/a.png"}),
     True, r"item.content\[1\]: image_url.url must be a data: URL"),
    (message({"type": "input_image", "image_url": "data:image/png;base64,!!"}), True, "not valid base64"),
    (message({"type": "input_image", "image_url": data_url(b"GIF89a but not really")}), True, "not a readable"),
    (message({"type": "input_image", "image_url": data_url(bomb_png(9_000, 8_000))}), True,
     "9000 x 8000 = 72000000 pixels, over the limit"),
    (message(*[{"type": "input_image", "image_url": "data:,"}] * (MAX_ITEM_IMAGES + 1)), True,
     f"over the limit of {MAX_ITEM_IMAGES} per item"),
    (message({"type": "input_text", "text": "x" * 2001}), True, "2001 characters is over the 2000 limit"),
])
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


class _Model:
    audio_input_rate = 16_000


def peer_of_model() -> VoicePeer:
    peer = VoicePeer.__new__(VoicePeer)  # _trimmed and _remember read only the model's input rate, the limits
    peer.model = _Model()
    peer.history = []
    return peer


def test_the_conversation_drops_its_oldest_turns_past_its_limits_keeping_system_ones():
    import numpy as np

    peer = peer_of_model()
    image = picture(8, 8, 0)
    turns = [("system", "You are brief.")]
    for i in range(6):  # each a user turn with 2 images, then its answer
        turns += [("user", f"look {i}", None, [image, image]), ("assistant", f"seen {i}")]
    assert peer._trimmed(turns) == turns[:1] + turns[5:]  # 8 images at most: the two oldest pairs go
    big = picture(1500, 1500, 1)  # 2.25 MP: two are over the 4.2 MP the conversation keeps
    shown = [("user", "a", None, [big]), ("assistant", "b"), ("user", "c", None, [big])]
    assert peer._trimmed(shown) == shown[2:]
    spoken = [("user", "", np.zeros(16_000 * 70, np.float32)), ("assistant", "a"),
              ("user", "", np.zeros(16_000 * 60, np.float32)), ("assistant", "b"), ("user", "now")]
    assert peer._trimmed(spoken) == spoken[2:]  # 130 s of audio is over 120: the oldest spoken turn goes
    chat = [(("user", f"q{i}") if i % 2 == 0 else ("assistant", f"a{i}")) for i in range(25)]
    kept = peer._trimmed(chat)
    assert len(kept) <= VoicePeer.MAX_HISTORY_TURNS and kept[0][0] == "user" and kept[-1] == chat[-1]
    assert peer._trimmed(chat[:5]) == chat[:5]  # within its limits, nothing moves


def test_an_answer_goes_right_after_the_item_it_answered():
    peer = peer_of_model()
    asked, later = ("user", "what is this", None, [picture(8, 8, 0)]), ("user", "and this")
    peer.history = [asked, later]  # the second came while the first was being answered
    peer._remember(None, "a colour field", answered=asked)
    assert peer.history == [asked, ("assistant", "a colour field"), later]
    peer._remember(("user", "hi"), "hello")  # a typed turn and its answer go at the end
    assert peer.history[-2:] == [("user", "hi"), ("assistant", "hello")]
