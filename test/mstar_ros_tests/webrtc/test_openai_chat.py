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
from mstar_ros.webrtc.openai_chat import decode_audio
from mstar_ros.webrtc.server import VoiceGateway
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
    ref = (torch.cat(direct["audio"]).clamp(-1, 1) * 32767).round().to(torch.int16).numpy()
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
    assert "audio is taken in user messages only" in messages[4]
    assert "not valid base64" in messages[0] and "the last message must be the user's" in messages[1]
    assert "modalities" in messages[2] and "empty turn" in messages[3]
    status, speech = got["speech"]
    assert status == 200 and len(speech) > 0
