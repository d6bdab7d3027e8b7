"""A peer's conversation: trimmed past its limits (system turns kept, the rest starting at a user turn), an
answer filed right after the item it answered; and, through the gateway with a model that answers (tiny
Qwen3-Omni, an aiortc peer without a microphone track): audio appended as events is a turn answered as the
same audio in process, instructions are a system turn, voices the model lacks are refused, and items are
truncated and deleted by id."""

from __future__ import annotations

import asyncio
import base64
import wave

import av
import numpy as np
import pytest
from aiohttp import ClientSession

from mstar_ros.webrtc.client import GatewayClient
from mstar_ros.webrtc.input_audio import AppendedAudio
from mstar_ros.webrtc.peer_conversation import PeerConversation
from mstar_ros.webrtc.realtime_items import ItemIds
from support.images import picture
from support.webrtc_gateway import gateway_for


class _Model:
    audio_input_rate = 16_000


def peer_of_model() -> PeerConversation:
    peer = PeerConversation()  # _trimmed and _remember read only the model's input rate, the limits, the items
    peer.model = _Model()
    peer.history = []
    peer.items = ItemIds()
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
    spoken = [
        ("user", "", np.zeros(16_000 * 70, np.float32)),
        ("assistant", "a"),
        ("user", "", np.zeros(16_000 * 60, np.float32)),
        ("assistant", "b"),
        ("user", "now"),
    ]
    assert peer._trimmed(spoken) == spoken[2:]  # 130 s of audio is over 120: the oldest spoken turn goes
    chat = [(("user", f"q{i}") if i % 2 == 0 else ("assistant", f"a{i}")) for i in range(25)]
    kept = peer._trimmed(chat)
    assert len(kept) <= PeerConversation.MAX_HISTORY_TURNS and kept[0][0] == "user" and kept[-1] == chat[-1]
    assert peer._trimmed(chat[:5]) == chat[:5]  # within its limits, nothing moves


def test_an_answer_goes_right_after_the_item_it_answered():
    peer = peer_of_model()
    asked, later = ("user", "what is this", None, [picture(8, 8, 0)]), ("user", "and this")
    peer.history = [asked, later]  # the second came while the first was being answered
    peer.items.add("answer", None, "assistant")
    peer._remember(None, "a colour field", answered=asked, answer_id="answer")
    assert peer.history == [asked, ("assistant", "a colour field"), later]
    assert peer.items.get("answer").turn is peer.history[1]  # the answer's item is its turn now
    peer.items.add("typed", None, "user")
    peer._remember(("user", "hi"), "hello", user_id="typed")  # a typed turn and its answer go at the end
    assert peer.history[-2:] == [("user", "hi"), ("assistant", "hello")]
    assert peer.items.get("typed").turn is peer.history[-2]


def pcm16_24k(path) -> np.ndarray:
    """The WAV's speech, resampled to what input_audio_buffer.append takes (pcm16 at 24 kHz)."""
    with wave.open(str(path)) as w:
        rate, pcm = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=24_000)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)]
    return np.concatenate(out)[int(2.3 * 24_000) :]  # from just before the speech


@pytest.mark.timeout(240)
def test_appended_audio_is_a_turn_answered_with_the_instructions_and_items_go_by_id(qwen3_omni, speech_wav):
    path, _ = speech_wav
    pcm = pcm16_24k(path)
    instructions = "You answer in one short sentence."

    async def answer(c, **turn) -> str:
        out = await c.submit(qwen3_omni.request(**turn, speak=False)).collect()
        return qwen3_omni.decode_text([int(t) for t in out["text_ids"]])

    async def main():
        async with gateway_for(qwen3_omni, model_name="qwen3-omni") as (c, gateway, url):
            client = GatewayClient()
            try:
                async with ClientSession() as http:
                    peer = gateway.peers[(await client.connect(http, url))["pc_id"]]
                client.send(
                    type="session.update",
                    session={"type": "realtime", "instructions": instructions, "audio": {"output": {"voice": "alloy"}}},
                )
                await client.until(lambda: "error" in client.types(), 10, "the voice's refusal")
                refused_state = peer.session_state()
                client.send(
                    type="session.update",
                    session={
                        "type": "realtime",
                        "instructions": instructions,
                        "max_output_tokens": 30,
                        "seed": 3,
                        "audio": {"input": {"turn_detection": None}, "output": {"voice": "Chelsie"}},
                    },
                )
                await client.until(lambda: "session.updated" in client.types(), 10, "session.updated")
                for piece in np.array_split(pcm, max(1, len(pcm) // 2400)):  # ~100 ms a piece
                    client.send(type="input_audio_buffer.append", audio=base64.b64encode(piece.tobytes()).decode())
                client.send(type="input_audio_buffer.commit")
                await client.until(lambda: "conversation.item.created" in client.types(), 20, "the turn's item")
                client.send(type="response.create")
                await client.until(lambda: "response.done" in client.types(), 120, "the answer")
                history = list(peer.history)
                buffer = AppendedAudio()
                buffer.append(base64.b64encode(pcm.tobytes()).decode())
                heard = buffer.take(qwen3_omni.audio_input_rate)
                expected = await answer(
                    c,
                    audio=torch_of(heard),
                    history=[("system", instructions)],
                    sampling=peer.sampling,
                    voice="chelsie",
                )
                without = await answer(c, audio=torch_of(heard), sampling=peer.sampling)
                done = next(e for e in client.events if e["type"] == "response.done")["response"]
                answer_id, audio_ms = done["output"][0]["id"], peer.items.get(done["output"][0]["id"]).audio_ms
                user_id = next(e for e in client.events if e["type"] == "input_audio_buffer.committed")["item_id"]
                client.send(type="conversation.item.truncate", item_id=user_id, content_index=0, audio_end_ms=0)
                client.send(
                    type="conversation.item.truncate", item_id=answer_id, content_index=0, audio_end_ms=audio_ms // 2
                )
                await client.until(lambda: "conversation.item.truncated" in client.types(), 10, "truncated")
                truncated = list(peer.history)
                client.send(type="conversation.item.delete", item_id=user_id)
                await client.until(lambda: "conversation.item.deleted" in client.types(), 10, "deleted")
                client.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm[:4800].tobytes()).decode())
                client.send(type="input_audio_buffer.clear")
                client.send(type="input_audio_buffer.commit")
                await client.until(lambda: client.types().count("error") == 3, 10, "the empty commit's error")
                return client.events, refused_state, history, truncated, list(peer.history), heard, expected, without
            finally:
                await client.close()

    events, refused_state, history, truncated, after, heard, expected, without = asyncio.run(main())
    types = [e["type"] for e in events]
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert "session.audio.output.voice 'alloy'" in errors[0]["message"] and "chelsie" in errors[0]["message"]
    assert refused_state["voice"] == "ethan" and refused_state["instructions"] is None  # nothing changed
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    assert updated["voice"] == "chelsie" and updated["instructions"] == instructions
    assert updated["turn_detection"] is None  # no microphone track: turns end with commit
    committed = types.index("input_audio_buffer.committed")
    assert types[committed + 1] == "conversation.item.created"
    item = events[committed + 1]["item"]
    assert item["role"] == "user" and item["content"] == [{"type": "input_audio", "transcript": None}]
    assert abs(events[committed]["audio_ms"] - len(heard) / 16) < 2
    transcript = next(e for e in events if e["type"] == "response.output_audio_transcript.done")["transcript"]
    assert transcript == expected and expected != without  # the instructions reached the model as a system turn
    assert [t[:2] for t in history] == [("user", ""), ("assistant", transcript)] and np.array_equal(
        history[0][2], heard
    )
    assert errors[1]["message"] == "only an assistant item can be truncated"
    cut = truncated[1][1]
    assert transcript.strip().startswith(cut) and 0 < len(cut) < len(transcript.strip())  # cut at a word
    assert [t[:2] for t in after] == [("assistant", cut)]  # the user's turn deleted by its id
    assert "input_audio_buffer.cleared" in types and "at least 100 ms" in errors[2]["message"]


def torch_of(samples):
    import torch

    return torch.from_numpy(samples)
