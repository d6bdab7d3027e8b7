"""OpenAI-compatible HTTP beside the gateway: ``POST /v1/audio/speech`` streamed as it is decoded, ``GET /v1/models``.

``/v1/audio/speech`` takes ``model``, ``input``, ``voice``, ``response_format`` (``wav`` or ``pcm``:
16-bit mono at the model's rate) and ``stream_format`` (``audio``: the bytes, chunked as each audio
chunk is decoded, a streamed WAV with an open-ended header; ``sse``: ``speech.audio.delta`` events
with base64 PCM, then ``speech.audio.done``), plus ``seed`` and ``max_tokens`` (our extensions: the
same seed gives the same audio as ``mstar-ros tts --seed``). A client that goes away cancels the request.
"""
from __future__ import annotations

import base64
import json
import struct

import msgspec
from aiohttp import web

from mstar.conductor.request import RequestError
from mstar_ros.webrtc.audio_out import pcm_s16
from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.json_body import BadJSON, decode_json


class SpeechBody(msgspec.Struct, forbid_unknown_fields=False):
    input: str
    model: str | None = None
    voice: str | None = None
    response_format: str = "wav"
    stream_format: str = "audio"
    seed: int | None = None
    max_tokens: int | None = None  # our extension, as `mstar-ros tts --max-tokens`


def wav_header(rate: int) -> bytes:
    """A mono 16-bit WAV header for a stream of unknown length (sizes 0xFFFFFFFF, as streaming servers write)."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


class OpenAISpeech:
    def __init__(self, model, conductor, model_name: str, max_text_chars: int) -> None:
        self.model, self.conductor, self.name, self.max_text_chars = model, conductor, model_name, max_text_chars

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/v1/models", self.models)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "mstar_ros"}]})

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)

    async def speech(self, request: web.Request) -> web.StreamResponse:
        try:
            body = decode_json(await request_body(request), SpeechBody)
        except BadJSON as exc:
            return self._error(400, f"bad request body: {exc}")
        if body.model not in (None, self.name):
            return self._error(400, f"model {body.model!r} is not served here (GET /v1/models: {self.name!r})")
        if body.response_format not in ("wav", "pcm") or body.stream_format not in ("audio", "sse"):
            return self._error(400, "response_format must be wav or pcm, stream_format audio or sse")
        if len(body.input) > self.max_text_chars:
            return self._error(400, f"input of {len(body.input)} characters is over the {self.max_text_chars} limit")
        sampling = None
        if body.seed is not None or body.max_tokens is not None:
            if body.max_tokens is not None and not 1 <= body.max_tokens <= self.model.default_sampling.max_tokens:
                return self._error(400, f"max_tokens must be in [1, {self.model.default_sampling.max_tokens}]")
            sampling = msgspec.structs.replace(self.model.default_sampling, seed=body.seed,
                                               max_tokens=body.max_tokens or self.model.default_sampling.max_tokens)
        try:
            # a model that answers has a separate way to say a given text (Qwen3-Omni: its Talker alone)
            speak = getattr(self.model, "speech_request", self.model.request)
            req = speak(body.input, voice=body.voice, sampling=sampling, outputs=frozenset({self.model.audio_output}))
        except ValueError as exc:
            return self._error(400, str(exc))
        sse = body.stream_format == "sse"
        content_type = "text/event-stream" if sse else ("audio/wav" if body.response_format == "wav" else "audio/pcm")
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if not sse and body.response_format == "wav":
            await response.write(wav_header(self.model.sample_rate))
        try:
            async for out in self.conductor.submit(req):
                if out.name != self.model.audio_output:
                    continue
                pcm = pcm_s16(out.data).tobytes()
                if sse:
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(pcm).decode()}
                    await response.write(f"data: {json.dumps(event)}\n\n".encode())
                else:
                    await response.write(pcm)
            if sse:
                await response.write(b'data: {"type": "speech.audio.done"}\n\n')
        except (ConnectionResetError, RequestError) as exc:  # the client went away, or the request failed
            await self._cancel(req.request_id)
            if isinstance(exc, RequestError) and sse:
                await response.write(f"data: {json.dumps({'type': 'error', 'error': {'message': str(exc)}})}\n\n".encode())
            return response
        await response.write_eof()
        return response

    async def _cancel(self, request_id: str) -> None:
        try:
            await self.conductor.cancel(request_id)
        except Exception:  # it had finished
            pass
