"""BAGEL as the gateway, the CLI and ROS serve it: image questions answered in text (``conversational``),
images made from a prompt (``image_generation``) or from a prompt and an image (``image_edit``).

It builds the model's own Walk Graph requests (mstar_graphs.bagel.requests) and reads their outputs:
``text_ids`` (an answer's tokens), ``image`` ([H, W, 3] uint8), and while an image is made ``flow_step``
(steps done) and ``preview`` (preview images). What the gateway needs of it is
mstar_ros.webrtc.image_models' protocol; nothing here knows of HTTP or ROS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from mstar.priority import Priority
from mstar.request import Request
from mstar.sampling_params import SamplingParams
from mstar_graphs.bagel.checkpoints import is_random_weights, resolve_path
from mstar_graphs.bagel.config import BagelConfig
from mstar_graphs.bagel.generation_params import MAX_PREVIEWS, GenerationParams
from mstar_graphs.bagel.guidance import GuidanceParams
from mstar_graphs.bagel.image_options import OPTIONS, OptionError, parse_image_options
from mstar_graphs.bagel.requests import MAX_INPUT_IMAGES, MAX_STEPS, BagelRequests
from mstar_graphs.bagel.think_requests import MAX_THINK_TOKENS, ThinkPlan
from mstar_graphs.bagel.tokenizer import BagelTokenizer
from mstar_graphs.bagel.vit_config import VitConfig
from mstar_graphs.common.image_events import ImageEvent

DEFAULT_STEPS = 50  # the reference inferencer's
PREVIEW, FLOW_STEP = "preview", "flow_step"  # graph outputs: a preview image, the flow steps done


class BagelModel:
    conversational = True
    image_input = True
    text_output = "text_ids"
    image_output = "image"
    default_sampling = SamplingParams(temperature=0.0, max_tokens=512)  # the reference answers greedily
    # chat's ``think``: the understanding think prompt first (``request(think=True)``), greedy, and the
    # reference's budget for the thought and the answer together (interleave_inference's max_think_token_n)
    chat_think = True
    think_sampling = SamplingParams(temperature=0.0, max_tokens=MAX_THINK_TOKENS)
    image_generation = True
    image_edit = True
    image_mask = False
    max_images_per_request = 4
    max_input_images = MAX_INPUT_IMAGES  # an edit's images, shown in order before its prompt
    default_image_steps = DEFAULT_STEPS
    image_options = OPTIONS  # the images API's extension fields BAGEL takes (mstar_graphs.bagel.image_options)

    def __init__(
        self, path: Path, *, dtype: str = "float32", requests_only: bool = False, cfg_parallel: bool = False
    ) -> None:
        """``cfg_parallel``: serve guided images by the Walk-driven flow, whose guidance views may sit on
        different Workers (config/placement/bagel-cfg-parallel.yaml needs it)."""
        self.path = path
        self.dtype = dtype
        self.config = BagelConfig.from_dir(path)
        self.tokenizer = BagelTokenizer.from_dir(path)
        vit = VitConfig.from_dir(path)
        self.requests = BagelRequests(self.tokenizer, self.config.dims, vit.patch_size, cfg_parallel=cfg_parallel)
        self._modules = None
        self._requests_only = requests_only
        self._ids = itertools.count()

    @classmethod
    def load(
        cls,
        weights: str | Path | None = None,
        *,
        preset: str = "tiny",
        dtype: str = "float32",
        progress: bool = True,
        requests_only: bool = False,
        cfg_parallel: bool | None = None,
        placement: str | Path | None = None,
    ) -> BagelModel:
        """``placement`` (the YAML the Conductor will serve by): with ``cfg_parallel`` None (the default), guided
        images take the Walk-driven flow exactly when the placement puts the guidance views on different
        ranks (``use_placement``); ``cfg_parallel`` True / False forces the choice."""
        path = resolve_path(weights, preset)
        model = cls(path, dtype=dtype, requests_only=requests_only, cfg_parallel=bool(cfg_parallel))
        if placement is not None and cfg_parallel is None:
            model.use_placement(placement)
        if not requests_only:
            model.modules(progress=progress)
        return model

    def use_placement(self, placement) -> bool:
        """Lays guided images out for ``placement`` (a YAML path or a resolved placement of this graph): the
        Walk-driven flow (CFG-parallel) when it puts the guidance views on different ranks, else the
        engine-resident one. Returns whether CFG-parallel is on. Servers call it before serving by a placement."""
        from mstar_graphs.bagel.view_placement import placement_splits_views

        self.requests.cfg_parallel = placement_splits_views(placement, self.graph())
        return self.requests.cfg_parallel

    @property
    def random_weights(self) -> bool:
        return is_random_weights(self.path)

    def graph(self, stop_at_im_end: bool = True):
        """The Walk Graph; ``stop_at_im_end=False``: answers run to their ``max_tokens`` (benchmarks on
        random weights, whose answers would end at a random ``<|im_end|>``)."""
        from mstar_graphs.bagel.graph import bagel_graph

        return bagel_graph(self.tokenizer.special.im_end if stop_at_im_end else None)

    def modules(self, progress: bool = False):
        if self._modules is None:
            if self._requests_only:
                raise RuntimeError("this BAGEL was loaded requests_only: its Workers hold the weights")
            from mstar_graphs.bagel.components import load_modules
            from mstar_graphs.bagel.graph import bagel_graph

            nodes = {n.name for n in bagel_graph(self.tokenizer.special.im_end).nodes}
            self._modules = load_modules(self.path, nodes, dtype=getattr(torch, self.dtype), progress=progress)
        return self._modules

    def worker_spec(self):
        from mstar_graphs.bagel.components import bagel_spec

        return bagel_spec(self.path, dtype=self.dtype)

    # ------------------------------------------------------------------ text

    @property
    def special_token_ids(self) -> dict[str, int]:
        return {"image": self.tokenizer.special.vision_start, "end": self.tokenizer.special.im_end}

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def check_images(self, images: Sequence) -> None:
        if len(images) > 8:
            raise ValueError(f"at most 8 images per conversation, got {len(images)}")

    def request(
        self,
        text: str | None = None,
        *,
        audio=None,
        images: Sequence = (),
        history: Sequence = (),
        voice=None,
        sampling: SamplingParams | None = None,
        outputs: frozenset[str] | None = None,
        speak: bool = False,
        request_id: str | None = None,
        think: bool = False,
    ) -> Request:
        """A conversation turn answered in text: ``history`` turns (role, text[, None, images]) then this
        one; each turn's images come before its text, as the reference lays out an interleaved context.
        ``think``: the model reasons first (the answer holds its reasoning)."""
        if speak or audio is not None:
            raise ValueError("BAGEL answers in text and takes no audio")
        turns = [(t[1], list(t[3]) if len(t) > 3 and t[3] else []) for t in history]
        turns.append((text or "", list(images)))
        sampling = sampling or self.default_sampling
        req = self.requests.conversation(
            [(words, [_pil(im) for im in shown]) for words, shown in turns],
            max_tokens=sampling.max_tokens,
            sampling=sampling,
            request_id=request_id or f"bagel-chat-{next(self._ids)}",
            think=think,
        )
        req.outputs = frozenset({self.text_output}) if outputs is None else outputs
        return req

    # ---------------------------------------------------------------- images

    def image_size(self, size: tuple[int, int] | None, inputs: list[tuple[int, int]]) -> tuple[int, int]:
        """(width, height) of the outputs: an edit's is its last input's size after the VAE resize rule (the
        reference's); a generation's is ``size`` (multiples of 16 up to the model's largest side) or that
        largest square."""
        if inputs:
            w, h = inputs[-1]
            width, height = self.requests.vae_transform.size_for(w, h)
            if size is not None and tuple(size) != (width, height):
                raise ValueError(
                    f"size {size[0]}x{size[1]}: an edit keeps its image's size ({width}x{height} after resizing)"
                )
            return width, height
        side = self.config.dims.max_latent_size * self.requests.downsample
        if size is None:
            return side, side
        height, width = self.requests.check_size(int(size[1]), int(size[0]))
        return width, height

    async def generate_images(
        self,
        conductor,
        *,
        prompt: str,
        images: list[np.ndarray],
        size: tuple[int, int],
        n: int,
        seed: int | None,
        steps: int | None,
        partial_images: int = 0,
        request_id: str,
        options: Mapping[str, Any] | None = None,
        guidance: GuidanceParams | None = None,
        priority: Priority | str | None = None,
    ) -> AsyncIterator[ImageEvent]:
        """The image capability's events (mstar_ros.webrtc.image_models): ``progress`` after every flow step,
        ``partial_images`` previews (the VAE decode of the clean latent predicted at steps spread over the
        flow, before its last), then the ``final`` image, per image. ``options``: BAGEL's own
        (mstar_graphs.bagel.image_options: ``guidance``, ``think``); ``guidance`` (Python callers): settings
        given whole, ``steps`` aside. With ``think`` each image's final event carries the thought as
        ``revised_prompt``. ``priority``: the class of every request it submits (None: batch,
        mstar_graphs.bagel.requests)."""
        steps = self.default_image_steps if steps is None else steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= MAX_STEPS:
            raise OptionError("steps", f"must be an integer in 2..{MAX_STEPS}, got {steps!r}")
        g, think = parse_image_options(options, edit=bool(images), steps=steps)
        if guidance is not None:
            g = dataclasses.replace(guidance, steps=steps)
        if not 0 <= partial_images <= MAX_PREVIEWS:
            raise ValueError(f"partial_images must be in 0..{MAX_PREVIEWS}, got {partial_images}")
        cls = None if priority is None else Priority.parse(priority)
        seed_base = seed if seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
        width, height = size
        progress = {"report_every": 1, "previews": partial_images}
        built: list = []  # per image: a Request, or (think) a ThinkPlan whose image request follows its thought
        for i in range(n):
            rid = f"{request_id}-{i}"
            sources = [_pil(image) for image in images]  # an edit's images, in order before the prompt
            if think:
                built.append(
                    self.requests.think(prompt, sources or None, size=(height, width), guidance=g, request_id=rid)
                )
            elif sources:
                built.append(
                    self.requests.edit(sources, prompt, guidance=g, seed=seed_base + i, request_id=rid, **progress)
                )
            else:
                built.append(
                    self.requests.generate(
                        prompt, size=(height, width), guidance=g, seed=seed_base + i, request_id=rid, **progress
                    )
                )
        evaluations = steps - 1  # flow steps: one fewer than the schedule's points
        prompt_tokens = len(self.tokenizer.encode(prompt))
        submitted: list[str] = []
        queue: asyncio.Queue = asyncio.Queue()

        def classed(req: Request) -> Request:
            if cls is not None:
                req.priority = cls
            return req

        async def events_of(i: int, req: Request, thought: str | None) -> None:
            req.outputs = frozenset({self.image_output, PREVIEW, FLOW_STEP})  # no latents to ship
            classed(req)
            submitted.append(req.request_id)
            tokens = prompt_tokens if i == 0 else 0
            async for event in self._image_events(conductor, req, i, evaluations, tokens, thought):
                await queue.put(event)

        async def pump(i: int, item) -> None:
            try:
                if isinstance(item, ThinkPlan):
                    try:
                        submitted.append(item.request.request_id)
                        ids = [int(out.data) async for out in conductor.submit(classed(item.request))]
                        image_req = self.requests.after_thought(item, ids, seed=seed_base + i, **progress)
                        await events_of(i, image_req, self.requests.thought(ids))
                    finally:
                        conductor.close_session(item.session_id)  # the contexts' and the thought's KV
                else:
                    await events_of(i, item, None)
                await queue.put(None)
            except Exception as exc:  # the consumer re-raises it
                await queue.put(exc)

        tasks = [asyncio.ensure_future(pump(i, item)) for i, item in enumerate(built)]
        try:
            done = 0
            while done < n:
                event = await queue.get()
                if isinstance(event, Exception):
                    raise event
                if event is None:
                    done += 1
                    continue
                yield event
        finally:
            for task in tasks:
                task.cancel()
            for rid in submitted:
                with contextlib.suppress(Exception):
                    await conductor.cancel(rid)

    async def _image_events(
        self, conductor, req: Request, index: int, evaluations: int, input_tokens: int, thought: str | None = None
    ) -> AsyncIterator[ImageEvent]:
        """One image's events from its request's outputs: ``progress`` per flow step (``flow_step``), a
        ``partial`` per preview, and the ``final`` image once the request is over (a preview decode still
        running when the final image is made is waited for: no partial comes after the final)."""
        preview_steps = GenerationParams.unpack(req.inputs["gen_params"]).preview_steps()
        final = None
        partials = 0
        async for out in conductor.submit(req):
            if out.name == FLOW_STEP:
                yield ImageEvent("progress", index, step=int(out.data), steps=evaluations)
            elif out.name == PREVIEW and partials < len(preview_steps):
                step = preview_steps[partials]
                yield ImageEvent(
                    "partial", index, _uint8(out.data), partial_index=partials, step=step, steps=evaluations
                )
                partials += 1
            elif out.name == self.image_output:
                final = _uint8(out.data)
        if final is None:
            raise RuntimeError(f"request {req.request_id!r} ended without an image")
        yield ImageEvent(
            "final",
            index,
            final,
            step=evaluations,
            steps=evaluations,
            input_tokens=input_tokens,
            revised_prompt=thought,
        )


def _uint8(image: torch.Tensor) -> np.ndarray:
    return image.numpy().astype(np.uint8)


def _pil(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return image
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"an image must be [H, W, 3] uint8, got {arr.shape} {arr.dtype}")
    return Image.fromarray(arr)
