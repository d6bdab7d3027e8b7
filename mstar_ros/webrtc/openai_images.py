"""OpenAI-compatible ``POST /v1/images/generations`` and ``POST /v1/images/edits`` for a model that makes
images (mstar_ros.webrtc.image_models says what it offers; nothing here is per model). An edit's inputs are
read by mstar_ros.webrtc.edit_inputs.

Generations take JSON; edits take ``multipart/form-data`` (``image`` or ``image[]`` files, ``mask``,
and the other fields as text, as OpenAI's clients send them) or JSON with the images as data URLs
(``images: [{"image_url": "data:..."}]``, as newer clients send them; this server fetches nothing and
keeps no files). The fields are mstar_ros.webrtc.image_params'. An input image is judged by its header
(format, width x height, the request's pixels together) before any pixel is decoded, its pixels are
decoded within the gateway's shared decoding budget, and a file that is not a readable image is a 400
naming its field. The outputs' pixels (n x width x height, from the model's ``image_size``) are
reserved in a budget shared by every image request, in arrival order (503 when it stays full), so one
client's flood waits behind itself. The answer: ``{"created", "data": [{"b64_json"}], "background",
"output_format", "size", "usage"}``; with ``stream``, SSE events ``image_generation.partial_image`` /
``image_edit.partial_image`` (``b64_json``, ``partial_image_index``, ...) as the model makes previews,
then ``image_generation.completed`` / ``image_edit.completed`` (``b64_json``, ``usage``, ...) per image;
with ``n`` > 1 each event also carries our ``image_index``. A client that goes away (streaming or not)
cancels the model's requests. Errors are OpenAI's JSON (mstar_ros.webrtc.openai_errors). A model's own
fields (``image_options``, e.g. BAGEL's ``guidance`` and ``think``) go to it as ``options``
(mstar_ros.webrtc.image_extensions); text it made an image from beyond the prompt (BAGEL's thought) comes
back as each image's ``revised_prompt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

import numpy as np
from aiohttp import web

from mstar_ros.webrtc.budget import BudgetBusy, OverBudget, SharedBudget
from mstar_ros.webrtc.edit_inputs import decode_inputs, read_edit
from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.image_encoding import b64_image
from mstar_ros.webrtc.image_extensions import decode_with_options
from mstar_ros.webrtc.image_models import ImageEvent
from mstar_ros.webrtc.image_params import GenerationBody, check_image_params
from mstar_ros.webrtc.media_parts import MAX_REQUEST_IMAGE_PIXELS, pixels, release_images
from mstar_ros.webrtc.openai_errors import APIError, error_response
from mstar_ros.webrtc.openai_http import model_mismatch

log = logging.getLogger("mstar_ros.webrtc")

GONE_POLL_S = 0.1  # how often a request whose client may have left is checked, between the model's events


class ClientGone(Exception):
    pass


def _gone(http: web.Request) -> bool:
    transport = http.transport
    return transport is None or transport.is_closing()


async def _while_connected(http: web.Request, work):
    """``work`` (a coroutine) run to its end, or cancelled as soon as the client has gone (ClientGone)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=GONE_POLL_S)
            if done:
                return task.result()
            if _gone(http):
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def usage_of(finals: list[ImageEvent]) -> dict:
    """OpenAI's image ``usage``, summed over a request's final events (the model's counts; 0 where it
    gives none)."""
    input_tokens = sum(e.input_tokens for e in finals)
    image_in = sum(e.input_image_tokens for e in finals)
    output_tokens = sum(e.output_tokens for e in finals)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"image_tokens": image_in, "text_tokens": input_tokens - image_in},
        "output_tokens": output_tokens,
        "output_tokens_details": {"image_tokens": output_tokens, "text_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _item(final: ImageEvent, fmt: str, compression: int) -> dict:
    """One ``data`` item: the image, and the text the model made it from beyond the prompt, if any."""
    item: dict[str, Any] = {"b64_json": b64_image(final.image, fmt, compression)}
    if final.revised_prompt is not None:
        item["revised_prompt"] = final.revised_prompt
    return item


class OpenAIImages:
    def __init__(
        self,
        model,
        conductor,
        model_name: str,
        decode_budget: SharedBudget | None = None,
        generate_budget: SharedBudget | None = None,
    ) -> None:
        self.model, self.conductor, self.name = model, conductor, model_name
        self.decode_budget = decode_budget or SharedBudget(MAX_REQUEST_IMAGE_PIXELS, "pixels of images being decoded")
        self.generate_budget = generate_budget or SharedBudget(16 * 2**20, "pixels of images being generated")

    def add_routes(self, app: web.Application) -> None:
        if getattr(self.model, "image_generation", False):
            app.router.add_post("/v1/images/generations", self.generations)
        if getattr(self.model, "image_edit", False):
            app.router.add_post("/v1/images/edits", self.edits)

    # -- the two routes ------------------------------------------------------------------------
    async def generations(self, http: web.Request) -> web.StreamResponse:
        try:
            body, options = decode_with_options(await request_body(http), GenerationBody, self.model)
            size = self._size(body, [])
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        return await self._serve(http, body, [], size, "image_generation", options)

    async def edits(self, http: web.Request) -> web.StreamResponse:
        try:
            body, opened, options = await read_edit(http, self.model, self.name)
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        try:
            size = self._size(body, [image.size for image, _ in opened])
            async with self.decode_budget.reserve(pixels(image for image, _ in opened)):
                arrays = await asyncio.to_thread(decode_inputs, opened)
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except BudgetBusy as exc:
            return error_response(503, str(exc))
        finally:
            release_images(image for image, _ in opened)
        return await self._serve(http, body, arrays, size, "image_edit", options)

    # -- reading and judging a request -----------------------------------------------------------
    def _size(self, body: GenerationBody, inputs: list[tuple[int, int]]) -> tuple[int, int]:
        model_mismatch(body.model, self.name)
        asked = check_image_params(body, self.model)
        try:
            width, height = self.model.image_size(asked, inputs)
        except ValueError as exc:
            raise APIError(400, str(exc), param="size", code="invalid_value") from None
        return int(width), int(height)

    # -- running the model and answering ---------------------------------------------------------
    async def _serve(
        self,
        http: web.Request,
        body: GenerationBody,
        images: list[np.ndarray],
        size: tuple[int, int],
        kind: str,
        options: dict[str, Any],
    ) -> web.StreamResponse:
        n = body.n or 1
        extra = {"options": options} if options else {}  # the model's own fields, only to a model that has them
        try:
            async with self.generate_budget.reserve(n * size[0] * size[1]):
                events = self.model.generate_images(
                    self.conductor,
                    prompt=body.prompt,
                    images=images,
                    size=size,
                    n=n,
                    seed=body.seed,
                    steps=body.steps,
                    partial_images=(body.partial_images or 0) if body.stream else 0,
                    request_id=f"img-{uuid.uuid4().hex[:16]}",
                    **extra,
                )
                try:
                    if body.stream:
                        return await self._stream(http, body, events, size, kind)
                    return await self._whole(http, body, events, size, n)
                finally:
                    await events.aclose()  # the model cancels what it still has in flight
        except OverBudget as exc:
            return error_response(400, f"n x size: {exc}", param="n", code="invalid_value")
        except BudgetBusy as exc:
            return error_response(503, str(exc))

    async def _first(self, http: web.Request, events) -> ImageEvent | None:
        """The model's first event; its ValueError (a refusal of this request's inputs, naming the field
        in ``param`` where it has one) is a 400."""
        try:
            return await _while_connected(http, anext(events, None))
        except ValueError as exc:
            raise APIError(400, str(exc), param=getattr(exc, "param", None), code="invalid_value") from None

    async def _whole(self, http: web.Request, body: GenerationBody, events, size, n: int) -> web.StreamResponse:
        fmt, compression = body.output_format or "png", body.output_compression or 100
        finals: dict[int, ImageEvent] = {}

        async def collect(first: ImageEvent | None) -> None:
            event = first
            while event is not None:
                if event.kind == "final":
                    finals[event.index] = event
                event = await anext(events, None)

        try:
            first = await self._first(http, events)
            await _while_connected(http, collect(first))
            if sorted(finals) != list(range(n)):
                raise RuntimeError(f"the model made images {sorted(finals)} of {n}")
            data = await asyncio.to_thread(lambda: [_item(finals[i], fmt, compression) for i in range(n)])
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except ClientGone:
            log.info("%s: the client went away; its images were cancelled", http.path)
            return web.Response(status=499)
        except Exception as exc:  # the model's requests failed
            log.warning("%s failed: %s: %s", http.path, type(exc).__name__, exc)
            return error_response(500, f"the model failed: {type(exc).__name__}: {exc}")
        return web.json_response(
            {
                "created": int(time.time()),
                "data": data,
                "background": "opaque",
                "output_format": fmt,
                "size": f"{size[0]}x{size[1]}",
                "usage": usage_of(list(finals.values())),
            }
        )

    async def _stream(self, http: web.Request, body: GenerationBody, events, size, kind: str) -> web.StreamResponse:
        fmt, compression = body.output_format or "png", body.output_compression or 100
        several = (body.n or 1) > 1
        try:
            first = await self._first(http, events)
        except APIError as exc:
            return error_response(exc.status, exc.message, param=exc.param, code=exc.code)
        except ClientGone:
            return web.Response(status=499)
        except Exception as exc:
            return error_response(500, f"the model failed: {type(exc).__name__}: {exc}")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(http)
        common = {"background": "opaque", "output_format": fmt, "quality": "auto", "size": f"{size[0]}x{size[1]}"}

        async def send(event: dict) -> None:
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())

        async def relay(event: ImageEvent | None) -> None:
            while event is not None:
                if event.kind != "progress":
                    b64 = await asyncio.to_thread(b64_image, event.image, fmt, compression)
                    out: dict[str, Any] = {"b64_json": b64, "created_at": int(time.time()), **common}
                    if event.kind == "partial":
                        out.update(type=f"{kind}.partial_image", partial_image_index=event.partial_index)
                    else:
                        out.update(type=f"{kind}.completed", usage=usage_of([event]))
                        if event.revised_prompt is not None:
                            out["revised_prompt"] = event.revised_prompt
                    if several:
                        out["image_index"] = event.index  # our extension: which of the n images
                    await send(out)
                event = await anext(events, None)

        try:
            await _while_connected(http, relay(first))
        except (ClientGone, ConnectionResetError):
            log.info("%s: the client went away; its images were cancelled", http.path)
            return response
        except Exception as exc:  # the model failed mid-way: the stream says so
            error = {"message": f"the model failed: {type(exc).__name__}: {exc}", "type": "server_error"}
            with contextlib.suppress(ConnectionResetError):
                await send({"type": "error", "error": {**error, "param": None, "code": None}})
            return response
        await response.write_eof()
        return response
