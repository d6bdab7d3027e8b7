"""OpenAI-compatible ``POST /v1/chat/completions`` for a model that answers (``conversational``).

``messages`` (system / user / assistant; the last one the user's; a user message's content may be
text parts and one ``input_audio`` part: base64 ``wav`` or ``pcm16`` at 24 kHz, as OpenAI takes it;
earlier spoken turns are heard again, as the reference takes a conversation's audio; and, for a model
that takes images (``image_input``), ``image_url`` parts with a ``data:`` URL (PNG, JPEG, WebP, GIF:
this server fetches nothing)),
``modalities`` ``["text"]`` or ``["text", "audio"]``, ``audio.voice``, ``audio.format`` (``pcm16``
or ``wav``), ``stream``, ``max_tokens`` (of the text), ``seed``. Streaming (SSE) sends
``chat.completion.chunk`` deltas as the model makes them: ``delta.content`` for text-only,
``delta.audio.transcript`` and ``delta.audio.data`` (base64 pcm16 at the model's rate) with audio,
then ``finish_reason`` and ``[DONE]``; a streaming client that leaves cancels the request. Without
streaming the whole message comes at the end (``message.audio.data`` a whole WAV or pcm16).
An assistant message may carry ``content: null`` with its ``audio.transcript`` (as OpenAI clients
send an earlier audio answer back); messages without text or audio are left out of the prompt.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import time
import uuid
import wave
from typing import Any

import msgspec
import numpy as np
import torch
from aiohttp import web

from mstar.conductor.request import RequestError
from mstar_ros.webrtc.audio_out import pcm_s16

PCM16_INPUT_RATE = 24_000  # OpenAI's pcm16 input audio


class AudioSpec(msgspec.Struct, forbid_unknown_fields=False):
    voice: str | None = None
    format: str = "pcm16"


class ChatBody(msgspec.Struct, forbid_unknown_fields=False):
    messages: list[dict[str, Any]]
    model: str | None = None
    modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])
    audio: AudioSpec | None = None
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None


class BadRequest(ValueError):
    pass


def decode_audio(part: dict[str, Any], rate: int) -> torch.Tensor:
    """An ``input_audio`` part -> mono float samples at ``rate``."""
    audio = part.get("input_audio") or {}
    fmt = audio.get("format", "wav")
    try:
        raw = base64.b64decode(audio.get("data", ""), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("input_audio.data is not valid base64") from None
    if fmt == "wav":
        try:
            with wave.open(io.BytesIO(raw)) as w:
                if w.getsampwidth() != 2:
                    raise BadRequest("input_audio wav must be 16-bit PCM")
                source_rate, channels = w.getframerate(), w.getnchannels()
                pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        except (wave.Error, EOFError) as exc:
            raise BadRequest(f"input_audio is not a readable wav: {exc}") from None
        pcm = pcm.reshape(-1, channels).mean(axis=1) if channels > 1 else pcm
    elif fmt == "pcm16":
        source_rate, pcm = PCM16_INPUT_RATE, np.frombuffer(raw[:len(raw) // 2 * 2], dtype=np.int16)
    else:
        raise BadRequest(f"input_audio.format {fmt!r}: wav or pcm16")
    samples = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
    if source_rate != rate and samples.numel():
        import av

        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = source_rate
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        out = [f.to_ndarray().reshape(-1) for f in [*resampler.resample(frame), *resampler.resample(None)]]
        samples = torch.from_numpy(np.concatenate(out).astype(np.float32) / 32768.0)
    return samples


MAX_IMAGES = 8                  # per request, all messages together
MAX_IMAGE_PIXELS = 8192 * 8192  # a declared size over this is refused before the image is decoded
MAX_REQUEST_IMAGE_PIXELS = 2 * MAX_IMAGE_PIXELS  # all of a request's images: what decoding them may hold
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


def decode_image(part: dict[str, Any], budget: list[int] | None = None, what: str = "the request's images",
                 limit: int | None = None):
    """An ``image_url`` part (a base64 ``data:`` URL) -> a decoded PIL image. ``budget`` ([pixels left]):
    the request's images share it, checked against each declared size before that image is decoded; ``what``
    and ``limit`` (default MAX_REQUEST_IMAGE_PIXELS) name it in the error."""
    import PIL.Image

    url = (part.get("image_url") or {}).get("url", "") if isinstance(part.get("image_url"), dict) else part.get("image_url")
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadRequest("image_url.url must be a data: URL (data:image/png;base64,...): this server fetches nothing")
    head, _, data = url.partition(",")
    if not head.endswith(";base64"):
        raise BadRequest("an image data: URL must be base64 (data:image/png;base64,...)")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("the image data: URL is not valid base64") from None
    try:
        image = PIL.Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)  # reads the header only
    except PIL.Image.DecompressionBombError as exc:
        raise BadRequest(f"the image is too large: {exc}") from None
    except Exception:  # PIL raises OSError, SyntaxError, ValueError ... for a file it cannot parse
        raise BadRequest(f"the image is not a readable {', '.join(IMAGE_FORMATS)} file") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise BadRequest(f"the image is {width} x {height} = {width * height} pixels, over the limit of "
                         f"{MAX_IMAGE_PIXELS}")
    if budget is not None:
        if width * height > budget[0]:
            raise BadRequest(f"{what} are over {MAX_REQUEST_IMAGE_PIXELS if limit is None else limit} pixels together")
        budget[0] -= width * height
    try:
        image.load()
    except Exception as exc:  # a corrupt chunk: SyntaxError("broken PNG file"), OSError (truncated) ...
        raise BadRequest(f"the image could not be decoded: {exc}") from None
    return image


def turn_of(message: dict[str, Any], rate: int | None, images_ok: bool = False,
            budget: list[int] | None = None) -> tuple[str, str, torch.Tensor | None, list]:
    """A message -> (role, its text, its audio or None, its images)."""
    role = message.get("role")
    if role not in ("system", "user", "assistant", "developer"):
        raise BadRequest(f"message role {role!r}: system, user or assistant")
    content = message.get("content")
    if content is None and role == "assistant":  # an audio answer sent back in a multi-turn conversation
        content = ((message.get("audio") or {}).get("transcript")) or ""
    if isinstance(content, str):
        return ("system" if role == "developer" else role), content, None, []
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of parts")
    texts, audio, images = [], None, []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind == "input_audio":
            if rate is None:
                raise BadRequest("this model takes no audio input")
            if audio is not None:
                raise BadRequest("one input_audio part per message")
            audio = decode_audio(part, rate)
        elif kind == "image_url":
            if not images_ok:
                raise BadRequest("this model takes no image input")
            images.append(decode_image(part, budget))
        else:
            raise BadRequest(f"content part type {kind!r}: text, input_audio or image_url")
    return ("system" if role == "developer" else role), " ".join(t for t in texts if t), audio, images


MAX_AUDIO_S = 300.0  # of all the messages' audio together (the Thinker hears it all, every request)


class OpenAIChat:
    def __init__(self, model, conductor, model_name: str, max_text_chars: int) -> None:
        self.model, self.conductor, self.name, self.max_text_chars = model, conductor, model_name, max_text_chars

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.completions)

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)

    def _request(self, body: ChatBody):
        if body.model not in (None, self.name):
            raise BadRequest(f"model {body.model!r} is not served here (GET /v1/models: {self.name!r})")
        if not set(body.modalities) <= {"text", "audio"} or "text" not in body.modalities:
            raise BadRequest('modalities must be ["text"] or ["text", "audio"]')
        if body.audio is not None and body.audio.format not in ("pcm16", "wav"):
            raise BadRequest("audio.format must be pcm16 or wav")
        if not body.messages:
            raise BadRequest("messages is empty")
        rate = getattr(self.model, "audio_input_rate", None)
        images_ok = bool(getattr(self.model, "image_input", False))
        image_parts = sum(1 for m in body.messages if isinstance(m.get("content"), list)
                          for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url")
        if image_parts > MAX_IMAGES:  # counted before any is decoded
            raise BadRequest(f"{image_parts} images, over the limit of {MAX_IMAGES} per request")
        budget = [MAX_REQUEST_IMAGE_PIXELS]
        turns = [turn_of(m, rate, images_ok, budget) for m in body.messages]
        role, text, audio, images = turns[-1]
        if role != "user":
            raise BadRequest("the last message must be the user's")
        if any((a is not None or i) and r != "user" for r, _, a, i in turns[:-1]):
            raise BadRequest("audio and images are taken in user messages only")
        if sum(len(t) for _, t, _, _ in turns) > self.max_text_chars:
            raise BadRequest(f"the messages' text is over the {self.max_text_chars}-character limit")
        heard_s = sum(len(a) for _, _, a, _ in turns if a is not None) / (rate or 1)
        if heard_s > MAX_AUDIO_S:
            raise BadRequest(f"the messages' audio is {heard_s:.0f} s, over the {MAX_AUDIO_S:g} s limit")
        speak = "audio" in body.modalities
        limit = body.max_completion_tokens or body.max_tokens
        sampling = self.model.default_sampling
        if body.seed is not None:
            sampling = msgspec.structs.replace(sampling, seed=body.seed)
        outputs = {self.model.text_output} | ({self.model.audio_output} if speak else set())
        # earlier turns: text, and a user's audio (heard again, as the reference takes a conversation's audio)
        history = [(r, t) if a is None and not i else (r, t, a, i) if i else (r, t, a)
                   for r, t, a, i in turns[:-1] if t.strip() or a is not None or i]
        extra = {"images": images} if images else {}
        request = self.model.request(text, audio=audio, history=history, **extra,
                                     voice=body.audio.voice if body.audio else None, sampling=sampling,
                                     outputs=frozenset(outputs), speak=speak)
        if limit is not None:
            if limit < 1:
                raise BadRequest("max_tokens must be >= 1")
            request.meta["thinker_max_tokens"] = min(limit, request.meta["thinker_max_tokens"])
        return request, speak

    async def completions(self, http: web.Request) -> web.StreamResponse:
        try:
            body = msgspec.json.decode(await http.read(), type=ChatBody)
            # decoding images and audio and preparing them is CPU work: off the loop that serves every peer
            request, speak = await asyncio.to_thread(self._request, body)
        except msgspec.DecodeError as exc:
            return self._error(400, f"bad request body: {exc}")
        except ValueError as exc:  # BadRequest, and the model's own refusals (empty turn, audio too long)
            return self._error(400, str(exc))
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
        fmt = body.audio.format if body.audio else "pcm16"
        if body.stream:
            return await self._stream(http, request, speak, cid, created)
        ids, pcm = [], []
        try:
            async for out in self.conductor.submit(request):
                if out.name == self.model.text_output:
                    ids.append(int(out.data))
                elif out.name == self.model.audio_output:
                    pcm.append(pcm_s16(out.data).tobytes())
        except RequestError as exc:
            return web.json_response({"error": {"message": str(exc), "type": "server_error"}}, status=500)
        text = self.model.decode_text(ids)
        message: dict[str, Any] = {"role": "assistant", "content": None if speak else text}
        if speak:
            data = b"".join(pcm)
            if fmt == "wav":
                data = _wav(data, self.model.sample_rate)
            message["audio"] = {"id": f"audio_{cid}", "data": base64.b64encode(data).decode(), "transcript": text}
        return web.json_response({"id": cid, "object": "chat.completion", "created": created, "model": self.name,
                                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                  "usage": {"completion_tokens": len(ids)}})

    async def _stream(self, http: web.Request, request, speak: bool, cid: str, created: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(http)

        async def chunk(delta: dict, finish: str | None = None) -> None:
            event = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": self.name,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())

        ids: list[int] = []
        said = ""
        try:
            await chunk({"role": "assistant"})
            async for out in self.conductor.submit(request):
                if out.name == self.model.text_output:
                    ids.append(int(out.data))
                    now = self.model.decode_text(ids)
                    if now.startswith(said) and len(now) > len(said) and not now.endswith("\ufffd"):
                        piece, said = now[len(said):], now
                        await chunk({"audio": {"transcript": piece}} if speak else {"content": piece})
                elif out.name == self.model.audio_output:
                    data = base64.b64encode(pcm_s16(out.data).tobytes()).decode()
                    await chunk({"audio": {"id": f"audio_{cid}", "data": data}})
            await chunk({}, finish="stop")
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, RequestError) as exc:  # the client went away, or the request failed
            try:
                await self.conductor.cancel(request.request_id)
            except Exception:
                pass
            if isinstance(exc, RequestError):
                await response.write(f"data: {json.dumps({'error': {'message': str(exc)}})}\n\n".encode())
            return response
        await response.write_eof()
        return response


def _wav(pcm: bytes, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()
