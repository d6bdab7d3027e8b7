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
    return [
        json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


def test_chat_completions_stream_text_and_audio_and_take_a_spoken_turn(qwen3_omni, speech_wav):
    path, _ = speech_wav
    chat = {
        "model": "qwen3-omni",
        "modalities": ["text", "audio"],
        "stream": True,
        "seed": 11,
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": "You are brief."},
            {"role": "user", "content": "hello there, how are you today"},
        ],
    }

    audio_part = {"type": "input_audio", "input_audio": {"data": wav_b64(path), "format": "wav"}}
    conversation = {
        "modalities": ["text"],
        "max_tokens": 6,
        "seed": 4,
        "stream": False,
        "messages": [
            {"role": "user", "content": [audio_part]},
            {"role": "assistant", "content": "hello there"},
            {"role": "user", "content": "how are you"},
        ],
    }

    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            # max_tokens caps the text and the audio frames: the model's own sampling.max_tokens
            same = qwen3_omni.request(
                "hello there, how are you today",
                history=[("system", "You are brief.")],
                sampling=msgspec.structs.replace(qwen3_omni.default_sampling, seed=11, max_tokens=8),
            )
            direct = await c.submit(same).collect()
            heard = decode_audio(audio_part, qwen3_omni.audio_input_rate)
            again = qwen3_omni.request(
                "how are you",
                history=[("user", "", heard), ("assistant", "hello there")],
                sampling=msgspec.structs.replace(qwen3_omni.default_sampling, seed=4, max_tokens=6),
                outputs=frozenset({"text_ids"}),
                speak=False,
            )
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
                    spoken = {
                        "modalities": ["text", "audio"],
                        "audio": {"format": "wav"},
                        "max_tokens": 6,
                        "messages": [
                            {
                                "role": "user",
                                "content": [
                                    {"type": "input_audio", "input_audio": {"data": wav_b64(path), "format": "wav"}}
                                ],
                            }
                        ],
                    }
                    async with http.post(f"{url}/v1/chat/completions", json=spoken) as r:
                        got["spoken"] = (r.status, await r.json())
                    # a conversation whose first turn was spoken: the model hears it again
                    async with http.post(f"{url}/v1/chat/completions", json=conversation) as r:
                        got["conversation"] = (r.status, await r.json())
                    bad = [
                        {
                            "messages": [
                                {
                                    "role": "user",
                                    "content": [
                                        {"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}
                                    ],
                                }
                            ]
                        },
                        {"messages": [{"role": "assistant", "content": "hi"}]},
                        {"modalities": ["video"], "messages": [{"role": "user", "content": "hi"}]},
                        {"messages": [{"role": "user", "content": "   "}]},
                        {
                            "messages": [
                                {"role": "assistant", "content": [audio_part]},
                                {"role": "user", "content": "hi"},
                            ]
                        },
                    ]
                    got["bad"] = []
                    for body in bad:
                        async with http.post(f"{url}/v1/chat/completions", json=body) as r:
                            got["bad"].append((r.status, (await r.json())["error"]["message"]))
                    async with http.post(
                        f"{url}/v1/audio/speech",
                        json={"input": "hello there", "response_format": "pcm", "max_tokens": 30},
                    ) as r:
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
    assert events[-2]["choices"][0]["finish_reason"] == "length"  # 8 tokens of random weights: cut by max_tokens
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
        [int(t) for t in direct_conversation["text_ids"]]
    )
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
    shown = {
        "modalities": ["text"],
        "max_tokens": 6,
        "seed": 3,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is this"}],
            }
        ],
    }
    later = {
        "modalities": ["text"],
        "max_tokens": 5,
        "seed": 3,  # the image stays in the conversation
        "messages": [
            shown["messages"][0],
            {"role": "assistant", "content": "a picture"},
            {"role": "user", "content": "and its colours"},
        ],
    }

    def body(part) -> dict:
        return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what"}]}]}

    bomb = "data:image/png;base64," + base64.b64encode(bomb_png(9000, 8000)).decode()
    big = "data:image/png;base64," + base64.b64encode(bomb_png(8000, 8000)).decode()  # 3 are over 2 x 8192^2
    bad = [
        body({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/cat.png"}}),
        body({"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}),
        body({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"no").decode()}}),
        body({"type": "image_url", "image_url": {"url": bomb}}),
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}] * 9}]},
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": url}}]},
                {"role": "user", "content": "hi"},
            ]
        },
        body(
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(broken_png()).decode()},
            }
        ),
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": big}}] * 3}]},
        # a header of 8192 x 8192 and no pixel data: refused for its tokens, which it could only be if its
        # pixels were never decoded (decoding would fail first)
        body(
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64," + base64.b64encode(undecodable_png(8192, 8192)).decode()},
            }
        ),
        body(
            {
                "type": "input_audio",
                "input_audio": {
                    "format": "wav",
                    "data": base64.b64encode(
                        b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0"
                        + bytes(4)
                        + bytes(4)
                        + b"\x02\0\x10\0data"
                        + bytes(4)
                    ).decode(),
                },
            }
        ),
    ]

    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            sampling = msgspec.structs.replace(qwen3_omni.default_sampling, seed=3)
            decoded = PIL.Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))
            first = qwen3_omni.request(
                "what is this", images=[decoded], sampling=sampling, outputs=frozenset({"text_ids"}), speak=False
            )
            first.meta["thinker_max_tokens"] = 6
            second = qwen3_omni.request(
                "and its colours",
                history=[("user", "what is this", None, [decoded]), ("assistant", "a picture")],
                sampling=sampling,
                outputs=frozenset({"text_ids"}),
                speak=False,
            )
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


def _seconds(data: bytes) -> float:
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return sum(f.samples for f in frames) / frames[0].sample_rate


def _refused(call) -> tuple:
    import openai

    try:
        call()
    except openai.APIStatusError as exc:
        return type(exc).__name__, exc.status_code, exc.param, exc.code
    raise AssertionError("not refused")


def test_the_openai_client_gets_usage_length_audio_formats_and_typed_errors(qwen3_omni):
    """chat.completions.create through the official client: full usage, finish_reason length when
    max_tokens cuts the reply, max_tokens bounding the audio too, each audio format, streaming with
    include_usage, text sampling honoured, and what the model cannot honour refused naming the field."""
    import openai

    hello = [{"role": "user", "content": "hello there, how are you today"}]

    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            reference = qwen3_omni.request(
                "hello there, how are you today", outputs=frozenset({"text_ids"}), speak=False
            )
            runner, url = await serve_gateway(VoiceGateway(qwen3_omni, c, model_name="qwen3-omni"))
            try:

                def calls():
                    oa, got = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0), {}
                    ask = dict(model="qwen3-omni", messages=hello, seed=3)
                    got["text"] = oa.chat.completions.create(**ask, max_tokens=5)
                    for fmt in ("pcm16", "wav", "mp3", "flac", "opus", "aac"):
                        got[fmt] = oa.chat.completions.create(
                            **ask, max_tokens=6, modalities=["text", "audio"], audio={"voice": "ethan", "format": fmt}
                        )
                    got["stream"] = list(
                        oa.chat.completions.create(
                            **ask,
                            max_tokens=6,
                            modalities=["text", "audio"],
                            stream=True,
                            stream_options={"include_usage": True},
                        )
                    )
                    got["hot"] = oa.chat.completions.create(**ask, max_tokens=5, temperature=1.8)
                    got["greedy"] = oa.chat.completions.create(**ask, max_tokens=5, temperature=0)
                    bad = {
                        "n": {"n": 2},
                        "temperature": {"temperature": 2.5},
                        "top_p": {"top_p": 1.5},
                        "logprobs": {"logprobs": True},
                        "stop": {"stop": ["\n"]},
                        "presence_penalty": {"presence_penalty": 0.5},
                        "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
                        "response_format": {"response_format": {"type": "json_object"}},
                        "audio.format": {
                            "modalities": ["text", "audio"],
                            "stream": True,
                            "audio": {"voice": "ethan", "format": "mp3"},
                        },
                        "max_tokens": {"max_tokens": 0},
                    }
                    got["bad"] = {
                        name: _refused(lambda kw=kw: oa.chat.completions.create(**ask, **kw))
                        for name, kw in bad.items()
                    }
                    got["unknown"] = _refused(lambda: oa.chat.completions.create(**ask, extra_body={"mood": "x"}))
                    got["model"] = _refused(lambda: oa.chat.completions.create(model="gpt-4o", messages=hello))
                    got["messages"] = _refused(
                        lambda: oa.chat.completions.create(
                            model="qwen3-omni", messages=[{"role": "assistant", "content": "hi"}]
                        )
                    )
                    # instructions: Qwen3-Omni says how in the user turn the Talker reads
                    say = dict(
                        model="qwen3-omni",
                        voice="ethan",
                        input="hello there",
                        response_format="pcm",
                        extra_body={"seed": 2, "max_tokens": 12},
                    )
                    got["plain"] = oa.audio.speech.create(**say).read()
                    got["instructed"] = oa.audio.speech.create(**say, instructions="Whisper, slowly.").read()
                    return got

                got = await asyncio.to_thread(calls)
                sampling = msgspec.structs.replace(qwen3_omni.default_sampling, seed=2, max_tokens=12)
                direct = await c.submit(
                    qwen3_omni.speech_request(
                        "hello there", voice="ethan", sampling=sampling, instructions="Whisper, slowly."
                    )
                ).collect()
                return reference, got, direct
            finally:
                await runner.cleanup()

    reference, got, direct = asyncio.run(main())
    prompt = int(reference.inputs["prompt_ids"].numel())
    text = got["text"]
    assert text.choices[0].finish_reason == "length" and text.choices[0].message.content  # 5 tokens of noise: cut
    assert text.usage.prompt_tokens == prompt and text.usage.completion_tokens == 5
    assert text.usage.total_tokens == prompt + 5
    assert text.usage.completion_tokens_details.text_tokens == 5
    assert text.usage.completion_tokens_details.audio_tokens == 0
    assert text.usage.prompt_tokens_details.audio_tokens == 0 and text.usage.prompt_tokens_details.cached_tokens == 0
    spoken = got["pcm16"]
    frames = spoken.usage.completion_tokens_details.audio_tokens
    pcm = base64.b64decode(spoken.choices[0].message.audio.data)
    assert 0 < frames <= 6  # max_tokens bounds the audio: at most 6 Talker frames of 80 ms
    assert spoken.usage.completion_tokens == spoken.usage.completion_tokens_details.text_tokens + frames
    assert spoken.choices[0].finish_reason == "length" and spoken.choices[0].message.audio.transcript
    assert 0 < len(pcm) / 2 / 24000 <= 6 * 0.08
    want = len(pcm) / 2 / 24000
    for fmt, slack in (("wav", 0), ("flac", 0), ("opus", 0), ("mp3", 2 * 1152), ("aac", 2 * 1024)):
        data = base64.b64decode(got[fmt].choices[0].message.audio.data)
        assert want - 1e-6 <= _seconds(data) <= want + slack / 24000 + 1e-6, (fmt, _seconds(data), want)
    chunks = got["stream"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == spoken.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"
    streamed = b"".join(
        base64.b64decode(ch.choices[0].delta.audio.data)
        for ch in chunks[:-1]
        if ch.choices[0].delta.audio and ch.choices[0].delta.audio.data
    )
    assert streamed == pcm  # the same seed: the same audio, streamed or whole
    # the text's sampling is the request's: a hot temperature leaves greedy decoding
    assert got["greedy"].choices[0].message.content == text.choices[0].message.content
    assert got["hot"].choices[0].message.content != text.choices[0].message.content
    bad = got["bad"]
    assert bad["n"] == ("BadRequestError", 400, "n", "unsupported_value")
    assert bad["temperature"] == ("BadRequestError", 400, "temperature", "decimal_above_max_value")
    assert bad["top_p"] == ("BadRequestError", 400, "top_p", "decimal_above_max_value")
    assert bad["logprobs"] == ("BadRequestError", 400, "logprobs", "unsupported_value")
    assert bad["stop"] == ("BadRequestError", 400, "stop", "unsupported_parameter")
    assert bad["presence_penalty"] == ("BadRequestError", 400, "presence_penalty", "unsupported_value")
    assert bad["tools"] == ("BadRequestError", 400, "tools", "unsupported_parameter")
    assert bad["response_format"] == ("BadRequestError", 400, "response_format", "unsupported_value")
    assert bad["audio.format"] == ("BadRequestError", 400, "audio.format", "unsupported_value")
    assert bad["max_tokens"] == ("BadRequestError", 400, "max_tokens", "integer_below_min_value")
    assert got["unknown"][:3] == ("BadRequestError", 400, "mood")
    assert got["model"] == ("NotFoundError", 404, "model", "model_not_found")
    assert got["messages"] == ("BadRequestError", 400, "messages", "invalid_value")
    reference_audio = (torch.cat(direct["audio"]).float().clamp(-1, 1) * 32767).round().to(torch.int16).numpy()
    instructed = np.frombuffer(got["instructed"], dtype=np.int16)
    assert len(instructed) == len(reference_audio) and np.abs(instructed.astype(int) - reference_audio).max() <= 1
    assert got["instructed"] != got["plain"]  # the instructions reached the Talker
