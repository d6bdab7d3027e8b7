"""/v1/chat/completions (and /v1/audio/speech) for a model that answers: tiny Qwen3-Omni behind the gateway."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import wave

import msgspec
import numpy as np
import torch
from aiohttp import ClientSession

from mstar.conductor import Conductor
from mstar_ros.webrtc.media_parts import decode_audio
from mstar_ros.webrtc.server import VoiceGateway
from support.images import bomb_png, broken_png, undecodable_png
from support.webrtc_gateway import serve_gateway


def wav_b64(path) -> str:
    return base64.b64encode(open(path, "rb").read()).decode()


def sse(text: str) -> list:
    return [json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
            for line in text.splitlines() if line.startswith("data: ")]


def test_chat_completions_stream_text_and_audio_and_take_a_spoken_turn(qwen3_omni, speech_wav):
    path, _ = speech_wav
    chat = {"model": "qwen3-omni", "modalities": ["text", "audio"], "stream": True, "seed": 11, "max_tokens": 8,
            "messages": [{"role": "system", "content": "You are brief."},
                         {"role": "user", "content": "hello there, how are you today"}]}

    audio_part = {"type": "input_audio", "input_audio": {"data": wav_b64(path), "format": "wav"}}
    conversation = {"modalities": ["text"], "max_tokens": 6, "seed": 4, "stream": False,
                    "messages": [{"role": "user", "content": [audio_part]},
                                 {"role": "assistant", "content": "hello there"},
                                 {"role": "user", "content": "how are you"}]}

    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            same = qwen3_omni.request("hello there, how are you today", history=[("system", "You are brief.")],
                                      sampling=msgspec.structs.replace(qwen3_omni.default_sampling, seed=11))
            same.meta["thinker_max_tokens"] = 8  # max_tokens caps the text
            direct = await c.submit(same).collect()
            heard = decode_audio(audio_part, qwen3_omni.audio_input_rate)
            again = qwen3_omni.request("how are you", history=[("user", "", heard), ("assistant", "hello there")],
                                       sampling=msgspec.structs.replace(qwen3_omni.default_sampling, seed=4),
                                       outputs=frozenset({"text_ids"}), speak=False)
            again.meta["thinker_max_tokens"] = 6
            direct_conversation = await c.submit(again).collect()
            runner, url = await serve_gateway(VoiceGateway(qwen3_omni, c, model_name="qwen3-omni"))
            got = {}
            try:
                async with ClientSession() as http:
                    async with http.post(f"{url}/v1/chat/completions", json=chat) as r:
                        got["stream"] = (r.status, r.headers["Content-Type"], await r.text())
                    text_only = {**chat, "stream": False, "modalities": ["text"]}
                    async with http.post(f"{url}/v1/chat/completions", json=text_only) as r:
                        got["text"] = (r.status, await r.json())
                    spoken = {"modalities": ["text", "audio"], "audio": {"format": "wav"}, "max_tokens": 6,
                              "messages": [{"role": "user", "content": [
                                  {"type": "input_audio", "input_audio": {"data": wav_b64(path), "format": "wav"}}]}]}
                    async with http.post(f"{url}/v1/chat/completions", json=spoken) as r:
                        got["spoken"] = (r.status, await r.json())
                    # a conversation whose first turn was spoken: the model hears it again
                    async with http.post(f"{url}/v1/chat/completions", json=conversation) as r:
                        got["conversation"] = (r.status, await r.json())
                    bad = [{"messages": [{"role": "user", "content": [{"type": "input_audio",
                                                                       "input_audio": {"data": "%%%", "format": "wav"}}]}]},
                           {"messages": [{"role": "assistant", "content": "hi"}]},
                           {"modalities": ["video"], "messages": [{"role": "user", "content": "hi"}]},
                           {"messages": [{"role": "user", "content": "   "}]},
                           {"messages": [{"role": "assistant", "content": [audio_part]}, {"role": "user", "content": "hi"}]}]
                    got["bad"] = []
                    for body in bad:
                        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                            got["bad"].append((r.status, (await r.json())["error"]["message"]))
                    async with http.post(f"{url}/v1/audio/speech", json={"input": "hello there", "response_format": "pcm",
                                                                          "max_tokens": 30}) as r:
                        got["speech"] = (r.status, await r.read())
            finally:
                await runner.cleanup()
            return direct, got, direct_conversation

    direct, got, direct_conversation = asyncio.run(main())
    status, kind, body = got["stream"]
    assert status == 200 and kind.startswith("text/event-stream")
    events = sse(body)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["delta"] == {"role": "assistant"}
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    transcript = "".join(d["audio"].get("transcript", "") for d in deltas if "audio" in d)
    pcm = b"".join(base64.b64decode(d["audio"]["data"]) for d in deltas if "data" in d.get("audio", {}))
    # the same request and seed as in process: the same text and the same samples
    assert transcript and transcript == qwen3_omni.decode_text([int(t) for t in direct["text_ids"]])
    ref = (torch.cat(direct["audio"]).float().clamp(-1, 1) * 32767).round().to(torch.int16).numpy()
    ours = np.frombuffer(pcm, dtype=np.int16)
    assert len(ours) == len(ref) > 0 and np.abs(ours.astype(int) - ref.astype(int)).max() <= 1
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    status, text = got["text"]
    assert status == 200 and text["choices"][0]["message"]["content"] and "audio" not in text["choices"][0]["message"]
    status, spoken = got["spoken"]
    message = spoken["choices"][0]["message"]
    assert status == 200 and message["audio"]["transcript"]
    with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 0
    status, answer = got["conversation"]
    assert status == 200, answer
    assert answer["choices"][0]["message"]["content"] == qwen3_omni.decode_text(
        [int(t) for t in direct_conversation["text_ids"]])
    messages = [m for _, m in got["bad"]]
    assert [s for s, _ in got["bad"]] == [400, 400, 400, 400, 400], got["bad"]
    assert "audio and images are taken in user messages only" in messages[4]
    assert "not valid base64" in messages[0] and "the last message must be the user's" in messages[1]
    assert "modalities" in messages[2] and "empty turn" in messages[3]
    status, speech = got["speech"]
    assert status == 200 and len(speech) > 0


def _png_data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_chat_completions_take_images_as_data_urls_and_refuse_bad_ones(qwen3_omni):
    import PIL.Image

    rng = np.random.default_rng(0)
    image = PIL.Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    url = _png_data_url(image)
    shown = {"modalities": ["text"], "max_tokens": 6, "seed": 3,
             "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                       {"type": "text", "text": "what is this"}]}]}
    later = {"modalities": ["text"], "max_tokens": 5, "seed": 3,  # the image stays in the conversation
             "messages": [shown["messages"][0], {"role": "assistant", "content": "a picture"},
                          {"role": "user", "content": "and its colours"}]}

    def body(part) -> dict:
        return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what"}]}]}
    bomb = "data:image/png;base64," + base64.b64encode(bomb_png(9000, 8000)).decode()
    big = "data:image/png;base64," + base64.b64encode(bomb_png(8000, 8000)).decode()  # 3 are over 2 x 8192^2
    bad = [body({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/cat.png"}}),
           body({"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}),
           body({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"no").decode()}}),
           body({"type": "image_url", "image_url": {"url": bomb}}),
           {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}] * 9}]},
           {"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": url}}]},
                         {"role": "user", "content": "hi"}]},
           body({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(broken_png()).decode()}}),
           {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": big}}] * 3}]},
           # a header of 8192 x 8192 and no pixel data: refused for its tokens, which it could only be if its
           # pixels were never decoded (decoding would fail first)
           body({"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                          + base64.b64encode(undecodable_png(8192, 8192)).decode()}}),
           body({"type": "input_audio", "input_audio": {"format": "wav", "data": base64.b64encode(
               b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0" + bytes(4) + bytes(4) + b"\x02\0\x10\0data"
               + bytes(4)).decode()}})]

    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            sampling = msgspec.structs.replace(qwen3_omni.default_sampling, seed=3)
            decoded = PIL.Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))
            first = qwen3_omni.request("what is this", images=[decoded], sampling=sampling,
                                       outputs=frozenset({"text_ids"}), speak=False)
            first.meta["thinker_max_tokens"] = 6
            second = qwen3_omni.request("and its colours", history=[("user", "what is this", None, [decoded]),
                                                                    ("assistant", "a picture")],
                                        sampling=sampling, outputs=frozenset({"text_ids"}), speak=False)
            second.meta["thinker_max_tokens"] = 5
            direct = [await c.submit(first).collect(), await c.submit(second).collect()]
            runner, gateway = await serve_gateway(VoiceGateway(qwen3_omni, c, model_name="qwen3-omni"))
            got = []
            try:
                async with ClientSession() as http:
                    for b in (shown, later, *bad):
                        async with http.post(f"{gateway}/v1/chat/completions", json=b) as r:
                            got.append((r.status, await r.json()))
                    nested = b'{"messages": [{"role": "user", "content": ' + b"[" * 30000
                    async with http.post(f"{gateway}/v1/chat/completions", data=nested) as r:
                        got.append((r.status, await r.json()))
            finally:
                await runner.cleanup()
            return direct, got

    direct, got = asyncio.run(main())
    for (status, answer), want in zip(got[:2], direct):
        assert status == 200, answer
        assert answer["choices"][0]["message"]["content"] == qwen3_omni.decode_text([int(t) for t in want["text_ids"]])
    errors = [(s, a["error"]["message"]) for s, a in got[2:]]
    assert [s for s, _ in errors] == [400] * 11, errors
    assert "fetches nothing" in errors[0][1] and "not valid base64" in errors[1][1]
    assert "not a readable" in errors[2][1] and "9000 x 8000 = 72000000 pixels, over the limit" in errors[3][1]
    assert "9 images, over the limit of 8" in errors[4][1] and "user messages only" in errors[5][1]
    assert "could not be decoded" in errors[6][1] or "not a readable" in errors[6][1]  # not a 500
    assert "images are over 134217728 pixels together" in errors[7][1]
    assert "the images make 12544 image tokens, over the 8128" in errors[8][1], errors[8]
    assert "sample rate 0 Hz" in errors[9][1] and "nested too deeply" in errors[10][1]
