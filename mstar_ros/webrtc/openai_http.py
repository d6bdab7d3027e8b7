"""OpenAI-compatible HTTP beside the gateway: ``POST /v1/audio/speech`` streamed as it is decoded, ``GET /v1/models``
(and ``/v1/models/{id}``: ``created``, and our ``random_weights``).

``/v1/audio/speech`` takes OpenAI's fields: ``model``, ``input`` (up to 4096 characters, OpenAI's
limit, or the gateway's ``max_text_chars`` if larger), ``voice`` (a name, or ``{"id": name}``),
``instructions`` (for a model with ``speech_instructions``; a 400 otherwise), ``response_format``
(``mp3``, the default, ``opus``, ``aac``, ``flac``, ``wav``, ``pcm``: mono at the model's rate, each
streamed as it is encoded; mstar_ros.webrtc.audio_formats), ``speed`` (0.25-4, time-stretched without
changing the pitch) and ``stream_format`` (``audio``: the file's bytes, chunked as each audio chunk is
decoded; ``sse``: ``speech.audio.delta`` events, each the next bytes of that file in base64, then
``speech.audio.done`` with ``usage``), plus ``seed`` and ``max_tokens`` (our extensions: the same seed
gives the same audio as ``mstar-ros tts --seed``) and ``priority`` (ours: the request's class, ``control``,
``interactive`` (the default) or ``batch``; docs/scheduling.md). A client that goes away cancels the request.
Refusals are OpenAI's error JSON naming the field (mstar_ros.webrtc.openai_errors).
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import msgspec
from aiohttp import web

from mstar.priority import Priority
from mstar.request import RequestError
from mstar_ros.webrtc.audio_formats import FORMATS, AudioEncoder
from mstar_ros.webrtc.audio_out import pcm_s16
from mstar_ros.webrtc.audio_tempo import MAX_SPEED, MIN_SPEED, TimeStretch
from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.json_body import BadJSON, decode_json
from mstar_ros.webrtc.openai_errors import APIError, check_range, error_response, param_of
from mstar_ros.webrtc.openai_usage import prompt_tokens, speech_usage

MAX_INPUT_CHARS = 4096  # OpenAI's limit for /v1/audio/speech


class SpeechBody(msgspec.Struct, forbid_unknown_fields=True):
    input: str
    model: str | None = None
    voice: str | dict[str, Any] | None = None
    instructions: str | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    seed: int | None = None
    max_tokens: int | None = None  # our extension, as `mstar-ros tts --max-tokens`
    # ours: the request's priority class (mstar.priority); None: the model's default (interactive)
    priority: str | None = None


def model_mismatch(asked: str | None, served: str) -> None:
    """OpenAI answers a model it does not serve with 404 ``model_not_found``."""
    if asked not in (None, served):
        raise APIError(
            404,
            f"The model {asked!r} does not exist here; this server serves {served!r} (GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def decode_body(raw: bytes, kind: type):
    try:
        return decode_json(raw, kind)
    except BadJSON as exc:
        raise APIError(400, f"bad request body: {exc}", param=param_of(str(exc)), code="invalid_request_body") from None


def voice_name(voice: str | dict[str, Any] | None) -> str | None:
    if isinstance(voice, dict):  # OpenAI's custom-voice reference {"id": ...}
        if not isinstance(voice.get("id"), str):
            raise APIError(400, 'voice must be a name or {"id": name}', param="voice", code="invalid_value")
        return voice["id"]
    return voice


class OpenAISpeech:
    def __init__(self, model, conductor, model_name: str, max_text_chars: int) -> None:
        self.model, self.conductor, self.name = model, conductor, model_name
        self.max_input_chars = max(max_text_chars, MAX_INPUT_CHARS)
        self.created = int(time.time())  # when this server started serving the model: /v1/models' `created`

    def add_routes(self, app: web.Application, speech: bool = True) -> None:
        """``/v1/models``, and ``/v1/audio/speech`` where the model speaks (``speech``)."""
        if speech:
            app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model_entry)

    def _entry(self) -> dict:
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "mstar_ros",
            # our extension: a model with random weights speaks noise (the page says so)
            "random_weights": bool(getattr(self.model, "random_weights", False)),
        }

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._entry()]})

    async def model_entry(self, request: web.Request) -> web.Response:
        model_mismatch(request.match_info["model"], self.name)
        return web.json_response(self._entry())

    def _request(self, body: SpeechBody):
        """The model's request for ``body``, every field checked first (APIError naming it)."""
        model_mismatch(body.model, self.name)
        priority = None
        if body.priority is not None:
            try:
                priority = Priority.parse(body.priority)
            except ValueError as exc:
                raise APIError(400, str(exc), param="priority", code="invalid_value") from None
        if body.response_format not in FORMATS:
            raise APIError(
                400,
                f"response_format {body.response_format!r}: one of {', '.join(FORMATS)}",
                param="response_format",
                code="invalid_value",
            )
        if body.stream_format not in ("audio", "sse"):
            raise APIError(
                400, f"stream_format {body.stream_format!r}: audio or sse", param="stream_format", code="invalid_value"
            )
        check_range("speed", body.speed, MIN_SPEED, MAX_SPEED)
        if not body.input.strip():
            raise APIError(400, "input is empty", param="input", code="invalid_value")
        if len(body.input) > self.max_input_chars:
            raise APIError(
                400,
                f"Invalid 'input': string too long. Expected a string with maximum length "
                f"{self.max_input_chars}, but got a string with length {len(body.input)} instead.",
                param="input",
                code="string_above_max_length",
            )
        extra = {}
        if body.instructions:
            if not getattr(self.model, "speech_instructions", False):
                raise APIError(
                    400,
                    f"{self.name} takes no instructions for speech",
                    param="instructions",
                    code="unsupported_parameter",
                )
            extra["instructions"] = body.instructions
        defaults = self.model.default_sampling
        sampling = None
        if body.seed is not None or body.max_tokens is not None:
            if body.max_tokens is not None:
                check_range("max_tokens", body.max_tokens, 1, defaults.max_tokens)
            sampling = msgspec.structs.replace(
                defaults, seed=body.seed, max_tokens=body.max_tokens or defaults.max_tokens
            )
        outputs = {self.model.audio_output}
        counted = getattr(self.model, "audio_token_output", None)  # what usage counts as output tokens
        if counted:
            outputs.add(counted)
        # a model that answers has a separate way to say a given text (Qwen3-Omni: its Talker alone)
        speak = getattr(self.model, "speech_request", self.model.request)
        try:
            request = speak(
                body.input, voice=voice_name(body.voice), sampling=sampling, outputs=frozenset(outputs), **extra
            )
        except ValueError as exc:  # the model's refusals: an unknown voice, text over its context
            raise APIError(400, str(exc), code="invalid_value") from None
        if priority is not None:
            request.priority = priority
        return request

    async def speech(self, request: web.Request) -> web.StreamResponse:
        try:
            body = decode_body(await request_body(request), SpeechBody)
            req = self._request(body)
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        sse = body.stream_format == "sse"
        encoder = AudioEncoder(body.response_format, self.model.sample_rate)
        stretch = TimeStretch(body.speed, self.model.sample_rate) if body.speed != 1.0 else None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream" if sse else encoder.content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)

        async def send(data: bytes) -> None:
            if not data:
                return
            if sse:
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                data = f"data: {json.dumps(event)}\n\n".encode()
            await response.write(data)

        counted, output_tokens = getattr(self.model, "audio_token_output", None), 0
        try:
            async for out in self.conductor.submit(req):
                if out.name == counted:
                    output_tokens += 1
                if out.name != self.model.audio_output:
                    continue
                pcm = pcm_s16(out.data)
                await send(encoder.encode(stretch.push(pcm) if stretch else pcm))
            await send(encoder.encode(stretch.finish()) if stretch else b"")
            await send(encoder.finish())
            if sse:
                done = {"type": "speech.audio.done", "usage": speech_usage(prompt_tokens(req), output_tokens)}
                await response.write(f"data: {json.dumps(done)}\n\n".encode())
        except (ConnectionResetError, RequestError) as exc:  # the client went away, or the request failed
            encoder.close()
            await self._cancel(req.request_id)
            if isinstance(exc, RequestError) and sse:
                error = {
                    "type": "error",
                    "error": {"message": str(exc), "type": "server_error", "param": None, "code": None},
                }
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
            return response
        await response.write_eof()
        return response

    async def _cancel(self, request_id: str) -> None:
        try:
            await self.conductor.cancel(request_id)
        except Exception:  # it had finished
            pass
