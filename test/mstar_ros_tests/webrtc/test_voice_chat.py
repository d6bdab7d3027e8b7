"""Voice chat through the gateway with a model that answers (tiny Qwen3-Omni, random weights): a spoken
turn from an aiortc microphone streams into the graph as it is said (its streamed input) and is answered
in voice with its transcript; a typed turn too; an image shown first (conversation.item.create) is seen
with the spoken turn; speaking over the answer cancels every stage and frees their KV."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io

import pytest
from aiohttp import ClientSession
from aiortc.contrib.media import MediaPlayer

from mstar.conductor import Conductor
from mstar_ros.webrtc.client import GatewayClient
from mstar_ros.webrtc.server import VoiceGateway
from support.images import picture
from support.webrtc_gateway import serve_gateway


@contextlib.asynccontextmanager
async def chatting(model, wav):
    """The model behind a gateway, one aiortc peer connected whose microphone plays ``wav``:
    (conductor, its idle KV block count, the peer's client, its microphone player, its gateway peer)."""
    async with Conductor(model.graph(), model.modules()) as c:
        idle = c.kv_blocks_used()
        gateway = VoiceGateway(model, c, model_name="qwen3-omni")
        runner, url = await serve_gateway(gateway)
        player = MediaPlayer(str(wav))
        client = GatewayClient(microphone=player.audio)
        try:
            async with ClientSession() as http:
                answer = await client.connect(http, url)
            yield c, idle, client, player, gateway.peers[answer["pc_id"]]
        finally:
            player.audio.stop()
            await client.close()
            await runner.cleanup()


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_spoken_turn_is_answered_in_voice_with_its_transcript(qwen3_omni, speech_wav):
    path, _ = speech_wav

    async def main():
        async with chatting(qwen3_omni, path) as (c, idle, client, player, peer):
            client.send(type="session.update", session={"max_output_tokens": 60, "seed": 3})
            await client.until(lambda: "input_audio_buffer.committed" in client.types(), 60, "the spoken turn")
            await client.until(lambda: "response.done" in client.types(), 120, "the answer")
            heard = client.loud_frames()
            player.audio.stop()
            client.send(type="response.create", text="hello there, how are you today")
            await client.until(lambda: client.types().count("response.done") == 2, 120, "the typed turn's answer")
            for _ in range(200):
                if c.kv_blocks_used() == idle:
                    break
                await asyncio.sleep(0.02)
            return client.events, heard, peer, c.kv_blocks_used(), idle

    events, heard, peer, blocks, idle = asyncio.run(main())
    types = [e["type"] for e in events]
    spoken = types.index("input_audio_buffer.committed")
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped") < spoken
    committed = events[spoken]
    assert 1000 < committed["audio_ms"] < 6000, committed  # the sentence, with the VAD's pre-roll and pad
    filed = events[spoken + 1]  # the spoken turn is an item of the conversation, answered by the next one
    assert filed["type"] == "conversation.item.created" and filed["item"]["id"] == committed["item_id"]
    assert filed["item"]["content"] == [{"type": "input_audio", "transcript": None}]
    answer_item = next(e for e in events if e["type"] == "response.output_item.added")
    assert (
        next(
            e
            for e in events
            if e["type"] == "conversation.item.created" and e["item"]["id"] == answer_item["item"]["id"]
        )["previous_item_id"]
        == committed["item_id"]
    )
    assert spoken < types.index("response.created")  # the answer starts when the turn ends
    # the turn streamed into its request while it was said: all but its last ~0.6 s before it ended
    turn = peer.last_turn
    assert turn is not None and turn.stream.samples == committed["audio_ms"] * 16 + turn.stream.samples % 16
    assert turn.stream.samples - turn.streamed_before_end < 16_000 * 0.7 < turn.streamed_before_end
    done = [e for e in events if e["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["completed", "completed"], types
    transcripts = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"]
    assert len(transcripts) == 2 and all(transcripts) and "".join(deltas) == "".join(transcripts)
    assert heard > 10  # the spoken answer's frames reached the peer
    assert peer.timings[0].audio_s > 0 and peer.timings[1].audio_s > 0
    # both turns are kept with their answers: the spoken one with its audio (heard again next turn, with the
    # typed one's prompt), the typed one as text
    assert [entry[:2] for entry in peer.history] == [
        ("user", ""),
        ("assistant", transcripts[0]),
        ("user", "hello there, how are you today"),
        ("assistant", transcripts[1]),
    ]
    assert len(peer.history[0][2]) == turn.stream.samples and len(peer.history[2]) == 2
    assert blocks == idle  # Thinker's and Talker's KV freed


def test_speaking_over_the_answer_cancels_every_stage(qwen3_omni, speech_wav):
    path, _ = speech_wav

    async def main():  # the microphone: 2.5 s of silence, then speech, which starts while the answer plays
        async with chatting(qwen3_omni, path) as (c, idle, client, player, peer):
            client.send(type="response.create", text="tell me a long story about robots")
            await client.until(lambda: "input_audio_buffer.speech_started" in client.types(), 60, "speech")
            await client.until(lambda: "response.done" in client.types(), 30, "the interrupted answer")
            first = next(e for e in client.events if e["type"] == "response.done")
            await asyncio.sleep(0.3)
            during = c.kv_blocks_used() if client.types().count("response.created") == 1 else None
            return first, during, idle

    first, during, idle = asyncio.run(main())
    assert first["response"]["status"] == "cancelled"
    assert first["response"]["status_details"]["reason"] == "turn_detected"  # cut by the user's speech
    assert during is None or during == idle  # no stage holds the cancelled answer's KV


def png_data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_an_image_shown_before_a_spoken_turn_is_seen_with_it_and_items_can_be_answered(qwen3_omni, speech_wav):
    import torch

    path, _ = speech_wav
    shown = picture(80, 60, 3)

    async def answer(c, **turn) -> str:
        out = await c.submit(qwen3_omni.request(**turn, speak=False)).collect()
        return qwen3_omni.decode_text([int(t) for t in out["text_ids"]])

    async def main():
        async with chatting(qwen3_omni, path) as (c, idle, client, player, peer):
            client.send(type="session.update", session={"max_output_tokens": 40, "seed": 3})
            client.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": png_data_url(shown)}],
                },
            )
            await client.until(lambda: "response.done" in client.types(), 120, "the spoken turn's answer")
            player.audio.stop()
            # bad items are errors; the peer keeps its conversation and goes on serving
            for item in (
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "input_image", "image_url": png_data_url(shown)}],
                },
                # a special token in its text: the model refuses the conversation with it, so it stays out
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hear <|audio_pad|> this"}],
                },
            ):
                client.send(type="conversation.item.create", item=item)
            await client.until(lambda: client.types().count("error") == 3, 30, "the bad items' errors")
            # a typed item, then response.create without text: the conversation's last item is answered
            client.send(
                type="conversation.item.create",
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "and what colour is it"}],
                },
            )
            client.send(type="response.create")
            await client.until(lambda: client.types().count("response.done") == 2, 120, "the item's answer")
            history = list(peer.history)
            heard = torch.from_numpy(peer.last_turn.audio)
            seen = history[0]
            expected = [
                await answer(c, audio=heard, history=[seen], sampling=peer.sampling),
                await answer(c, text="and what colour is it", history=history[:3], sampling=peer.sampling),
            ]
            blind = await answer(c, audio=heard, sampling=peer.sampling)
            return client.events, history, expected, blind

    events, history, expected, blind = asyncio.run(main())
    types = [e["type"] for e in events]
    created = [e for e in events if e["type"] == "conversation.item.created"]
    assert types.index("conversation.item.created") < types.index("input_audio_buffer.speech_started")
    assert created[0]["item"]["content"] == [{"type": "input_image", "width": 80, "height": 60}]
    errors = [e["error"]["message"] for e in events if e["type"] == "error"]
    assert "data: URL" in errors[0] and "user messages only" in errors[1] and "audio_pad" in errors[2]
    transcripts = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    done = [e["response"]["status"] for e in events if e["type"] == "response.done"]
    assert done == ["completed", "completed"]
    assert transcripts == expected and expected[0] != blind  # the spoken turn's answer saw the image
    roles = [(turn[0], turn[1]) for turn in history]
    assert roles == [
        ("user", ""),
        ("user", ""),
        ("assistant", transcripts[0]),
        ("user", "and what colour is it"),
        ("assistant", transcripts[1]),
    ]
    # the image is kept prepared (resized and patched once, not again each turn): as the model prepares it
    prepared = history[0][3][0]
    assert torch.equal(prepared.pixel_values, qwen3_omni.prepare_image(shown).pixel_values)
    assert history[1][2] is not None
