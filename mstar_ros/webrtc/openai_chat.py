"""OpenAI-compatible ``POST /v1/chat/completions`` for a model that answers (``conversational``).

``messages`` (system / user / assistant; the last one the user's; a user message's content may be
text parts and one ``input_audio`` part: base64 ``wav`` or ``pcm16`` at 24 kHz, as OpenAI takes it;
earlier spoken turns are heard again, as the reference takes a conversation's audio; and, for a model
that takes images (``image_input``), ``image_url`` parts with a ``data:`` URL (PNG, JPEG, WebP, GIF:
this server fetches nothing)),
``modalities`` ``["text"]`` or ``["text", "audio"]`` (``["text"]`` only for a model that does not speak), and the other fields of OpenAI's request as
mstar_ros.webrtc.chat_params says (honoured, or a 400 naming the field). Streaming (SSE) sends
``chat.completion.chunk`` deltas as the model makes them: ``delta.content`` for text-only,
``delta.audio.transcript`` and ``delta.audio.data`` (base64 pcm16 at the model's rate) with audio,
then ``finish_reason`` (``length`` when ``max_tokens`` cut the text or the audio), a last chunk with
``usage`` if ``stream_options.include_usage``, and ``[DONE]``; a streaming client that leaves cancels
the request. Without streaming the whole message comes at the end (``message.audio.data`` a whole file
in ``audio.format``) with ``usage`` (mstar_ros.webrtc.openai_usage). Errors are OpenAI's JSON.
With ``think`` (a model's extension, mstar_ros.webrtc.chat_params) the model reasons first and the reply's
reasoning comes apart from its answer, as vLLM's and SGLang's reasoning parsers return it:
``message.reasoning_content`` beside ``message.content`` (streamed: ``delta.reasoning_content``, then
``delta.content``; mstar_ros.webrtc.reasoning_split). An assistant message may carry ``content: null`` with its ``audio.transcript`` (as OpenAI clients
send an earlier audio answer back); messages without text or audio are left out of the prompt.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any

import msgspec
import numpy as np
import torch
from aiohttp import web

from mstar.priority import Priority
from mstar.request import Request, RequestError
from mstar_ros.webrtc.audio_formats import encode_whole
from mstar_ros.webrtc.audio_out import pcm_s16
from mstar_ros.webrtc.budget import BudgetBusy, SharedBudget
from mstar_ros.webrtc.chat_params import ChatBody, check_chat_params, text_sampling
from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.image_models import speaks
from mstar_ros.webrtc.media_parts import (
    MAX_AUDIO_S,
    MAX_REQUEST_IMAGE_PIXELS,
    BadRequest,
    decode_audio,
    image_url,
    load_image,
    open_image,
    pixels,
    release_images,
)
from mstar_ros.webrtc.openai_errors import APIError, error_response
from mstar_ros.webrtc.openai_http import decode_body, model_mismatch, voice_name
from mstar_ros.webrtc.openai_usage import chat_usage
from mstar_ros.webrtc.reasoning_split import ReasoningStream, split_reasoning

MAX_IMAGES = 8  # per request, all messages together


def turn_of(
    message: dict[str, Any],
    rate: int | None,
    images_ok: bool = False,
    budget: list[int] | None = None,
    seconds_left: list[float] | None = None,
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
    def __init__(
        self, model, conductor, model_name: str, max_text_chars: int, decode_budget: SharedBudget | None = None
    ) -> None:
        self.model, self.conductor, self.name, self.max_text_chars = model, conductor, model_name, max_text_chars
        # pixels of images being decoded at once, shared with every route and peer that takes images
        self.decode_budget = decode_budget or SharedBudget(MAX_REQUEST_IMAGE_PIXELS, "pixels of images being decoded")

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.completions)

    def _parse(self, body: ChatBody) -> list[tuple[str, str, torch.Tensor | None, list]]:
        """The request's fields and turns, checked (APIError naming the field), their audio decoded and their
        images opened (headers only) and judged against the model's room for them: no pixel decoded here."""
        model_mismatch(body.model, self.name)
        check_chat_params(body, self.model)
        if "audio" in (body.modalities or ()) and not speaks(self.model):
            raise APIError(
                400,
                f"Unsupported value: 'modalities' does not support audio here: {self.name} answers in text only",
                param="modalities",
                code="unsupported_value",
            )
        try:
            return self._turns(body)
        except BadRequest as exc:  # everything _turns judges is in the messages
            raise APIError(400, str(exc), param="messages", code="invalid_value") from None

    def _turns(self, body: ChatBody) -> list[tuple[str, str, torch.Tensor | None, list]]:
        if not body.messages:
            raise BadRequest("messages is empty")
        rate = getattr(self.model, "audio_input_rate", None)
        images_ok = bool(getattr(self.model, "image_input", False))
        image_parts = sum(
            1
            for m in body.messages
            if isinstance(m.get("content"), list)
            for p in m["content"]
            if isinstance(p, dict) and p.get("type") == "image_url"
        )
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
        speak = "audio" in (body.modalities or ())
        limit = body.max_completion_tokens or body.max_tokens
        sampling = self.model.default_sampling
        if body.think:  # a thought before the answer: the model's own budget for both (BAGEL: the reference's 1000)
            sampling = getattr(self.model, "think_sampling", sampling)
        if body.seed is not None:
            sampling = msgspec.structs.replace(sampling, seed=body.seed)
        if limit is not None:  # the model caps the reply's text tokens and its audio frames by it
            sampling = msgspec.structs.replace(sampling, max_tokens=min(limit, sampling.max_tokens))
        counted = getattr(self.model, "audio_token_output", None)  # what usage counts as output audio tokens
        outputs = {self.model.text_output} | ({self.model.audio_output, counted} - {None} if speak else set())
        # earlier turns: text, and a user's audio (heard again, as the reference takes a conversation's audio)
        history = [
            (r, t) if a is None and not i else (r, t, a, i) if i else (r, t, a)
            for r, t, a, i in turns[:-1]
            if t.strip() or a is not None or i
        ]
        extra = {"images": images} if images else {}
        if body.think:
            extra["think"] = True
        request = self.model.request(
            text,
            audio=audio,
            history=history,
            **extra,
            voice=voice_name(body.audio.voice) if body.audio else None,
            sampling=sampling,
            outputs=frozenset(outputs),
            speak=speak,
        )
        # a model that answers samples its text with the request's own sampling (the voice's is `sampling`)
        request.sampling = text_sampling(body, request.sampling)
        if body.priority is not None:  # checked by check_chat_params
            request.priority = Priority.parse(body.priority)
        return request, speak

    def _finish_reason(self, request: Request, ids: list[int], frames: int) -> str:
        """``length`` when a cap cut the text (it lacks the model's end token) or the audio."""
        end = (getattr(self.model, "special_token_ids", None) or {}).get("end")
        text_cap = request.meta.get("thinker_max_tokens")
        if text_cap is not None and len(ids) >= text_cap and (not ids or ids[-1] != end):
            return "length"
        # the Talker's first step makes code 0 only: N steps give at most N - 1 frames
        audio_cap = request.meta.get("talker_max_tokens")
        if frames and audio_cap is not None and frames >= audio_cap - 1:
            return "length"
        return "stop"

    async def completions(self, http: web.Request) -> web.StreamResponse:
        try:
            body = decode_body(await request_body(http), ChatBody)
            # decoding images and audio and preparing them is CPU work: off the loop that serves every peer
            turns = await asyncio.to_thread(self._parse, body)
            async with self.decode_budget.reserve(pixels(image for *_, images in turns for image in images)):
                try:
                    request, speak = await asyncio.to_thread(self._build, body, turns)
                finally:  # the request holds the model's resized copies: the decoded originals go now,
                    release_images(image for *_, images in turns for image in images)  # not after the reply
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except BudgetBusy as exc:
            return error_response(503, str(exc))
        except ValueError as exc:  # the model's own refusals (empty turn, audio too long, an unknown voice)
            return error_response(400, str(exc), param="messages", code="invalid_value")
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:16]}", int(time.time())
        fmt = body.audio.format if body.audio else "pcm16"
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await self._stream(http, request, speak, cid, created, include_usage, bool(body.think))
        ids, pcm, frames = [], [], 0
        counted = getattr(self.model, "audio_token_output", None)
        try:
            async for out in self.conductor.submit(request):
                if out.name == self.model.text_output:
                    ids.append(int(out.data))
                elif out.name == self.model.audio_output:
                    pcm.append(pcm_s16(out.data))
                elif out.name == counted:
                    frames += 1
        except RequestError as exc:
            return error_response(500, str(exc))
        text = self.model.decode_text(ids)
        message: dict[str, Any] = {"role": "assistant", "content": None if speak else text, "refusal": None}
        if body.think:
            message["reasoning_content"], message["content"] = split_reasoning(text)
        if speak:
            samples = np.concatenate(pcm) if pcm else np.zeros(0, np.int16)
            data = encode_whole(samples, "pcm" if fmt == "pcm16" else fmt, self.model.sample_rate)
            # expires_at: OpenAI keeps an answer's audio an hour for a later turn to cite; this server keeps none
            message["audio"] = {
                "id": f"audio_{cid}",
                "data": base64.b64encode(data).decode(),
                "expires_at": created + 3600,
                "transcript": text,
            }
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": self._finish_reason(request, ids, frames),
            "logprobs": None,
        }
        return web.json_response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": self.name,
                "choices": [choice],
                "usage": chat_usage(self.model, request, len(ids), frames),
            }
        )

    async def _stream(
        self,
        http: web.Request,
        request: Request,
        speak: bool,
        cid: str,
        created: int,
        include_usage: bool,
        think: bool = False,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(http)

        async def send(choices: list, **more) -> None:
            event = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.name,
                "choices": choices,
                **more,
                **({"usage": None} if include_usage and "usage" not in more else {}),
            }
            await response.write(f"data: {json.dumps(event)}\n\n".encode())

        async def chunk(delta: dict, finish: str | None = None) -> None:
            await send([{"index": 0, "delta": delta, "finish_reason": finish}])

        ids: list[int] = []
        said, frames = "", 0
        reasoning = ReasoningStream() if think else None
        counted = getattr(self.model, "audio_token_output", None)
        try:
            await chunk({"role": "assistant"})
            async for out in self.conductor.submit(request):
                if out.name == counted:
                    frames += 1
                if out.name == self.model.text_output:
                    ids.append(int(out.data))
                    now = self.model.decode_text(ids)
                    if reasoning is not None:
                        if not now.endswith("\ufffd"):
                            for field, piece in reasoning.feed(now):
                                await chunk({field: piece})
                    elif now.startswith(said) and len(now) > len(said) and not now.endswith("\ufffd"):
                        piece, said = now[len(said) :], now
                        await chunk({"audio": {"transcript": piece}} if speak else {"content": piece})
                elif out.name == self.model.audio_output:
                    data = base64.b64encode(pcm_s16(out.data).tobytes()).decode()
                    await chunk({"audio": {"id": f"audio_{cid}", "data": data}})
            if reasoning is not None:  # the answer ended: what was held back as a possible tag is text
                for field, piece in reasoning.feed(self.model.decode_text(ids), final=True):
                    await chunk({field: piece})
            await chunk({}, finish=self._finish_reason(request, ids, frames))
            if include_usage:  # OpenAI's last chunk: no choices, the whole request's usage
                await send([], usage=chat_usage(self.model, request, len(ids), frames))
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, RequestError) as exc:  # the client went away, or the request failed
            try:
                await self.conductor.cancel(request.request_id)
            except Exception:
                pass
            if isinstance(exc, RequestError):
                error = {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
            return response
        await response.write_eof()
        return response
