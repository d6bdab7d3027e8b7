"""A response's events in OpenAI's order, with the ids clients use; the conversation's items by id."""

from __future__ import annotations

import pytest

from mstar_ros.webrtc.events import EventError
from mstar_ros.webrtc.realtime_items import ItemIds, ResponseEvents


def test_a_response_sends_its_item_part_deltas_and_done_events_in_order():
    sent = []
    events = ResponseEvents(lambda kind, **fields: sent.append({"type": kind, **fields}), "resp_1", "tara")
    events.begin("item_before")
    events.audio()
    events.delta("Hel")
    events.audio()  # started once
    events.delta("lo")
    events.finish("completed", {"total_tokens": 3})
    assert [e["type"] for e in sent] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "output_audio_buffer.started",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    at = {"response_id": "resp_1", "item_id": events.item_id, "output_index": 0, "content_index": 0}
    for e in sent[5:10]:
        assert {k: e[k] for k in at} == at, e
    assert sent[2]["previous_item_id"] == "item_before"
    done = sent[-1]["response"]
    assert done["status"] == "completed" and done["usage"] == {"total_tokens": 3}
    assert done["output"] == [
        {
            "id": events.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_audio", "transcript": "Hello"}],
        }
    ]
    cancelled = []
    ResponseEvents(lambda kind, **f: cancelled.append({"type": kind, **f}), "resp_2").finish(
        "cancelled", {}, reason="turn_detected"
    )
    assert cancelled[-1]["response"]["status_details"] == {
        "type": "cancelled",
        "reason": "turn_detected",
        "error": None,
    }
    assert cancelled[-2]["item"]["status"] == "incomplete"


def test_items_follow_their_turns_and_unknown_ids_are_errors():
    items = ItemIds()
    asked, answer = ("user", "hi"), ("assistant", "hello")
    assert items.add("a", asked, "user") is None and items.add("b", None, "assistant") == "a"
    items.update("b", turn=answer, audio_ms=900)
    assert items.get("b").turn is answer and items.get("b").audio_ms == 900
    items.keep_only([answer])  # the history was trimmed: the user turn went
    assert "a" not in items and "b" in items
    with pytest.raises(EventError) as refused:
        items.get("a")
    assert refused.value.code == "item_not_found" and refused.value.param == "item_id"
    items.remove("b")
    assert items.last is None
