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
import io
import json
import time
import uuid
import wave
from typing import Any

import msgspec
import torch
from aiohttp import web

from mstar.conductor.request import RequestError
from mstar_ros.webrtc.audio_out import pcm_s16
from mstar_ros.webrtc.budget import BudgetBusy, SharedBudget
from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.json_body import decode_json
from mstar_ros.webrtc.media_parts import (MAX_AUDIO_S, MAX_REQUEST_IMAGE_PIXELS, BadRequest, decode_audio, image_url,
                                          load_image, open_image, pixels)

MAX_IMAGES = 8  # per request, all messages together


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


def turn_of(message: dict[str, Any], rate: int | None, images_ok: bool = False,
            budget: list[int] | None = None, seconds_left: list[float] | None = None
            ) -> tuple[str, str, torch.Tensor | None, list]:
    """A message -> (role, its text, its audio or None, its images: opened, their pixels not yet decoded).
    ``budget`` ([pixels]) and ``seconds_left`` ([seconds]): what the request's images and audio may still take."""
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
            audio = decode_audio(part, rate, seconds_left)
        elif kind == "image_url":
            if not images_ok:
                raise BadRequest("this model takes no image input")
            images.append(open_image(image_url(part), budget))
        else:
            raise BadRequest(f"content part type {kind!r}: text, input_audio or image_url")
    return ("system" if role == "developer" else role), " ".join(t for t in texts if t), audio, images


class OpenAIChat:
    def __init__(self, model, conductor, model_name: str, max_text_chars: int,
                 decode_budget: SharedBudget | None = None) -> None:
        self.model, self.conductor, self.name, self.max_text_chars = model, conductor, model_name, max_text_chars
        # pixels of images being decoded at once, shared with every route and peer that takes images
        self.decode_budget = decode_budget or SharedBudget(MAX_REQUEST_IMAGE_PIXELS, "pixels of images being decoded")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.completions)

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)

    def _parse(self, body: ChatBody) -> list[tuple[str, str, torch.Tensor | None, list]]:
        """The request's turns, checked, their audio decoded and their images opened (headers only) and
        judged against the model's room for them: no image pixel is decoded here."""
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
        budget, seconds_left = [MAX_REQUEST_IMAGE_PIXELS], [MAX_AUDIO_S]
        turns = [turn_of(m, rate, images_ok, budget, seconds_left) for m in body.messages]
        role = turns[-1][0]
        if role != "user":
            raise BadRequest("the last message must be the user's")
        if any((a is not None or i) and r != "user" for r, _, a, i in turns[:-1]):
            raise BadRequest("audio and images are taken in user messages only")
        if sum(len(t) for _, t, _, _ in turns) > self.max_text_chars:
            raise BadRequest(f"the messages' text is over the {self.max_text_chars}-character limit")
        heard_s = sum(len(a) for _, _, a, _ in turns if a is not None) / (rate or 1)
        if heard_s > MAX_AUDIO_S:
            raise BadRequest(f"the messages' audio is {heard_s:.0f} s, over the {MAX_AUDIO_S:g} s limit")
        check_images = getattr(self.model, "check_images", None)  # their tokens against the context, from sizes
        every_image = [image for *_, images in turns for image in images]
        if every_image and check_images is not None:
            check_images(every_image)
        return turns

    def _build(self, body: ChatBody, turns: list) -> tuple:
        """(the request, whether it speaks): the images decoded (their pixels reserved by the caller), the
        model's request made."""
        for *_, images in turns:
            for image in images:
                load_image(image)
        _, text, audio, images = turns[-1]
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
            body = decode_json(await request_body(http), ChatBody)
            # decoding images and audio and preparing them is CPU work: off the loop that serves every peer
            turns = await asyncio.to_thread(self._parse, body)
            async with self.decode_budget.reserve(pixels(image for *_, images in turns for image in images)):
                request, speak = await asyncio.to_thread(self._build, body, turns)
        except BudgetBusy as exc:
            return self._error(503, str(exc))
        except ValueError as exc:  # BadJSON, BadRequest, and the model's own refusals (empty turn, audio too long)
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
