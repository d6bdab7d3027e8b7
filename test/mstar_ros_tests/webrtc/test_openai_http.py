"""/v1/audio/speech and /v1/models through the official ``openai`` client, tiny Orpheus behind the gateway:
every response format decodes (PyAV) to the audio's duration, streaming and SSE with usage, speed,
and each refusal as the client's typed error naming the field, the gateway serving on after each."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import types

import av
import msgspec
import numpy as np
import openai
import pytest
import torch

from mstar.conductor import Conductor
from mstar.priority import Priority
from mstar.request import Request, SamplingParams
from mstar_ros.webrtc.openai_errors import APIError
from mstar_ros.webrtc.openai_http import OpenAISpeech, SpeechBody, decode_body
from mstar_ros.webrtc.server import VoiceGateway
from support.webrtc_gateway import serve_gateway

TEXT, SEED, MAX_TOKENS = "Hello there, how are you today?", 5, 140
RATE = 24_000
# what an encoder may add past the samples (priming and padding): two codec frames
SLACK_S = {"mp3": 2 * 1152 / RATE, "aac": 2 * 1024 / RATE, "opus": 0.0, "flac": 0.0, "wav": 0.0}
TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(audio=0))
    return sum(f.samples for f in frames) / frames[0].sample_rate


def client(url: str, key: str = "x") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def speak(c: openai.OpenAI, **kw) -> tuple[bytes, str]:
    kw = {
        "model": "orpheus",
        "voice": "tara",
        "input": TEXT,
        "extra_body": {"seed": SEED, "max_tokens": MAX_TOKENS},
        **kw,
    }
    r = c.audio.speech.create(**kw)
    return r.read(), r.response.headers["content-type"]


def refused(call) -> tuple:
    """(exception class name, status, param, code, message) of a call the server refuses."""
    try:
        call()
    except openai.APIStatusError as exc:
        return type(exc).__name__, exc.status_code, exc.param, exc.code, exc.body.get("message", "")
    raise AssertionError("not refused")


def test_every_response_format_streams_and_decodes_to_the_audios_duration(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            sampling = msgspec.structs.replace(orpheus.default_sampling, seed=SEED, max_tokens=MAX_TOKENS)
            req = orpheus.request(TEXT, sampling=sampling)
            direct = await c.submit(req).collect()
            runner, url = await serve_gateway(VoiceGateway(orpheus, c))
            try:

                def calls():
                    oa, got = client(url), {}
                    got["models"] = oa.models.list().data
                    got["model"] = oa.models.retrieve("orpheus")
                    for fmt in TYPES:
                        got[fmt] = speak(oa, response_format=fmt)
                    got["default"] = speak(oa)  # mp3, as OpenAI's default
                    with oa.audio.speech.with_streaming_response.create(
                        model="orpheus",
                        voice="tara",
                        input=TEXT,
                        response_format="mp3",
                        extra_body={"seed": SEED, "max_tokens": MAX_TOKENS},
                    ) as r:
                        got["chunks"] = list(r.iter_bytes())
                    with oa.audio.speech.with_streaming_response.create(
                        model="orpheus",
                        voice="tara",
                        input=TEXT,
                        response_format="pcm",
                        stream_format="sse",
                        extra_body={"seed": SEED, "max_tokens": MAX_TOKENS},
                    ) as r:
                        got["sse"] = (r.headers["content-type"], r.read().decode())
                    got["fast"] = speak(oa, response_format="pcm", speed=2.0)
                    got["slow"] = speak(oa, response_format="wav", speed=0.5)
                    return got

                return direct, req, await asyncio.to_thread(calls)
            finally:
                await runner.cleanup()

    direct, req, got = asyncio.run(main())
    [entry] = got["models"]
    assert entry.id == "orpheus" and isinstance(entry.created, int) and entry.created > 0
    assert entry.random_weights is True and got["model"].id == "orpheus"  # the tiny checkpoint's weights are random
    reference = (np.concatenate([a.numpy() for a in direct["audio"]]).clip(-1, 1) * 32767).round().astype(np.int16)
    pcm, kind = got["pcm"]
    assert kind == "audio/pcm" and abs(len(pcm) // 2 - len(reference)) == 0
    want = len(reference) / RATE
    for fmt, slack in SLACK_S.items():
        data, kind = got[fmt]
        assert kind == TYPES[fmt], (fmt, kind)
        assert want - 1e-6 <= seconds(data) <= want + slack + 1e-6, (fmt, seconds(data), want)
    assert got["default"] == got["mp3"]  # no response_format: mp3
    # streamed as it is encoded: several chunks, the same bytes as the whole file
    assert len(got["chunks"]) > 1 and b"".join(got["chunks"]) == got["mp3"][0]
    kind, text = got["sse"]
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert kind.startswith("text/event-stream") and events[-1]["type"] == "speech.audio.done"
    sse_pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and sse_pcm == pcm
    usage = events[-1]["usage"]
    assert usage == {
        "input_tokens": int(req.inputs["prompt_ids"].numel()),
        "output_tokens": len(direct["tokens"]),
        "total_tokens": int(req.inputs["prompt_ids"].numel()) + len(direct["tokens"]),
    }, usage
    fast = len(got["fast"][0]) / 2 / RATE
    assert abs(fast - want / 2) <= 0.03 * want, (fast, want)  # speed 2: half the time
    assert abs(seconds(got["slow"][0]) - want * 2) <= 0.03 * want * 2  # speed 0.5: twice


def test_refusals_are_the_clients_typed_errors_naming_the_field_and_the_gateway_serves_on(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            gateway = VoiceGateway(orpheus, c, host="127.0.0.1", token="s3cret")
            runner, url = await serve_gateway(gateway)
            try:

                def calls():
                    oa, out = client(url, "s3cret"), {}
                    out["speed"] = refused(lambda: speak(oa, speed=4.5))
                    out["format"] = refused(lambda: speak(oa, response_format="ogg"))
                    out["instructions"] = refused(lambda: speak(oa, instructions="Whisper it."))
                    out["too_long"] = refused(lambda: speak(oa, input="a" * 4097))
                    out["unknown_field"] = refused(lambda: speak(oa, extra_body={"emotion": "happy"}))
                    out["wrong_type"] = refused(lambda: speak(oa, input=5))
                    out["model"] = refused(lambda: speak(oa, model="tts-1"))
                    out["model_entry"] = refused(lambda: oa.models.retrieve("tts-1"))
                    out["route"] = refused(lambda: oa.files.list())
                    out["method"] = refused(lambda: oa.post("/models", cast_to=object, body={}))
                    out["too_big"] = refused(lambda: speak(oa, input="a" * 70_000))  # over the 64 KiB body limit
                    out["key"] = refused(lambda: client(url, "wrong").models.list())
                    # OpenAI's limit: 4096 characters pass the length check (the tiny model's context then holds them)
                    out["longest"] = speak(
                        oa, input="hello there " * 341, response_format="pcm", extra_body={"seed": 1, "max_tokens": 14}
                    )[0]
                    return out

                return await asyncio.to_thread(calls)
            finally:
                await runner.cleanup()

    out = asyncio.run(main())
    assert out["speed"][:4] == ("BadRequestError", 400, "speed", "decimal_above_max_value"), out["speed"]
    assert out["format"][:3] == ("BadRequestError", 400, "response_format") and "mp3" in out["format"][4]
    assert out["instructions"][:4] == ("BadRequestError", 400, "instructions", "unsupported_parameter")
    assert out["too_long"][:4] == ("BadRequestError", 400, "input", "string_above_max_length")
    assert "maximum length 4096" in out["too_long"][4]
    assert out["unknown_field"][:3] == ("BadRequestError", 400, "emotion"), out["unknown_field"]
    assert out["wrong_type"][:3] == ("BadRequestError", 400, "input"), out["wrong_type"]
    assert out["model"][:4] == ("NotFoundError", 404, "model", "model_not_found")
    assert out["model_entry"][:4] == ("NotFoundError", 404, "model", "model_not_found")
    assert out["route"][:2] == ("NotFoundError", 404) and "GET /v1/files" in out["route"][4]
    assert out["method"][1] == 405 and "allowed: GET" in out["method"][4], out["method"]
    assert out["too_big"][1] == 413 and "65536" in out["too_big"][4], out["too_big"]
    assert out["key"][:4] == ("AuthenticationError", 401, None, "invalid_api_key")
    assert len(out["longest"]) > 0


def test_a_speech_body_priority_sets_the_requests_class_and_a_bad_one_is_a_400_naming_it():
    model = types.SimpleNamespace(
        audio_output="audio",
        default_sampling=SamplingParams(),
        request=lambda text, voice, sampling, outputs: Request({"prompt": torch.tensor([1])}, SamplingParams()),
    )
    speech = OpenAISpeech(model, None, "orpheus", 0)

    def request(**fields):
        return speech._request(decode_body(json.dumps({"input": "hi", **fields}).encode(), SpeechBody))

    assert request().priority == Priority.INTERACTIVE
    assert request(priority="batch").priority == Priority.BATCH
    with pytest.raises(APIError) as refusal:
        request(priority="urgent")
    assert (refusal.value.status, refusal.value.param) == (400, "priority")
