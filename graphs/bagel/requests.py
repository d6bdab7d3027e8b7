"""BAGEL requests: an image question, a text-to-image prompt, an edit - as the reference's inferencer
builds its three contexts (full; without the last text; without the images), laid out for the engine.

- understanding: ``[ViT spans of each turn's images, the turn's text ..., <|im_start|>]`` on the full
  context, then decoding;
- text-to-image: full context ``[prompt turn]``; the no-text context is empty; the no-image context
  equals the full one, so its velocity is the conditional one (``image_branch="main"``);
- editing (one image or several, texts between them allowed): full ``[VAE span 1, ViT span 1, VAE span 2,
  ViT span 2, ..., instruction turn]``, no-text: the full one before its last text, no-image: the texts
  (mstar_graphs.bagel.interleaved_contexts); the output has the last image's (VAE-resized) size. The
  no-text context is the full one's prefix: the full view forks its KV (request meta ``"llm.kv_from"``)
  and brings only the instruction's rows, their positions continuing the no-text counter - except with
  ``cfg_parallel``, whose placement keeps the views apart (each context is then prefilled whole);
- think mode: the think prompt turn first in every context (mstar_graphs.bagel.think_requests).

Every input image is first resized by the VAE rule, then by the ViT rule (the reference does so
even for understanding). Several images travel packed (mstar_graphs.bagel.image_pack). The VAE encoding of a context image is its Gaussian's mean (the reference
samples it; a served model answers the same request the same way).

Priority classes (mstar.priority): text-to-image, edits and their think step are ``batch`` (an image
takes seconds; it yields between steps to robots and voices); understanding is ``interactive``, the
default. A front-end may set ``request.priority`` otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from PIL import Image

from mstar.priority import Priority
from mstar.request import Request
from mstar.sampling_params import SamplingParams
from mstar_graphs.bagel.config import BagelDims
from mstar_graphs.bagel.context_layout import ImagePart, Markers, Part, TextPart, view_inputs
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.graph import (
    SHARED_PREFIX_KEY,
    SHARED_PREFIX_VIEW,
    THINK_INPUT,
    VIEW_PORTS,
    view_input_name,
)
from mstar_graphs.bagel.guidance import GuidanceParams
from mstar_graphs.bagel.image_pack import pack_images
from mstar_graphs.bagel.image_transform import ImageTransform, rgb_on_white
from mstar_graphs.bagel.interleaved_contexts import GenerationContexts, Input, generation_contexts
from mstar_graphs.bagel.think_prompts import GENERATE_THINK_PROMPT, UNDERSTAND_THINK_PROMPT
from mstar_graphs.bagel.think_requests import MAX_THINK_TOKENS, ThinkPlan, thought_text
from mstar_graphs.bagel.tokenizer import BagelTokenizer

MAX_STEPS = 250  # flow evaluations a request may ask for (the released default is 50)
MAX_INPUT_IMAGES = 4  # an edit's input images (each up to 1024 x 1024: ~9k context rows with the real model)


@dataclass(frozen=True)
class PreparedImage:
    vae: torch.Tensor  # [3, H, W] in [-1, 1], H and W multiples of 16
    vit: torch.Tensor  # [3, H', W'] in [-1, 1], multiples of the ViT patch

    @property
    def size(self) -> tuple[int, int]:
        return int(self.vae.shape[1]), int(self.vae.shape[2])


class BagelRequests:
    """Builds BAGEL's Requests from text, PIL images and guidance settings; errors name the bad field."""

    def __init__(self, tokenizer: BagelTokenizer, dims: BagelDims, vit_patch: int, cfg_parallel: bool = False) -> None:
        """``cfg_parallel``: guided images take the Walk-driven flow (``image_gen_cfg_parallel``), for a
        placement that puts the guidance views on different Workers."""
        self.tokenizer = tokenizer
        self.cfg_parallel = cfg_parallel
        self.dims = dims
        self.vae_transform = ImageTransform(*dims.vae_transform)
        self.vit_transform = ImageTransform(*dims.vit_transform)
        self.markers = Markers(tokenizer.special.vision_start, tokenizer.special.vision_end)
        self.vit_patch = vit_patch
        self.token_width = dims.latent_patch_size**2 * dims.latent_channels
        self.downsample = 8 * dims.latent_patch_size  # pixels per latent token side

    # ----------------------------------------------------------------- images

    def prepare_image(self, image: Image.Image) -> PreparedImage:
        rgb = rgb_on_white(image)
        resized = self.vae_transform.resize(rgb)  # the VAE rule first, for every image (as the reference)
        return PreparedImage(vae=self.vae_transform(resized), vit=self.vit_transform(resized))

    def vit_rows(self, image: PreparedImage) -> int:
        patch = self.vit_patch
        return (image.vit.shape[1] // patch) * (image.vit.shape[2] // patch)

    def vae_rows(self, image: PreparedImage) -> int:
        return (image.vae.shape[1] // self.downsample) * (image.vae.shape[2] // self.downsample)

    def check_size(self, height: int, width: int, field: str = "size") -> tuple[int, int]:
        """(height, width) of an image to generate, or ValueError naming ``field``."""
        step, grid = self.downsample, self.dims.max_latent_size
        for name, v in (("height", height), ("width", width)):
            if not isinstance(v, int) or v < step or v % step:
                raise ValueError(f"{field}: {name} {v} must be a positive multiple of {step} pixels")
            if v // step > grid:
                raise ValueError(f"{field}: {name} {v} is over the model's {grid * step} pixels")
        return height, width

    # ---------------------------------------------------------------- requests

    def _turn(self, text: str, field: str) -> TextPart:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{field} must be a non-empty string")
        return TextPart(tuple(self.tokenizer.text_turn(text)))

    def _views(self, contexts: dict[str, list[Part]], starts: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
        """Each view's prefill inputs; ``starts``: a view whose parts continue a context it forks (the
        position counter it starts at)."""
        inputs: dict[str, torch.Tensor] = {}
        for view, parts in contexts.items():
            if not parts:
                continue  # an empty context: no prefill, its branch sees only its own rows
            laid = view_inputs(parts, self.markers, (starts or {}).get(view, 0)).tensors()
            for port in VIEW_PORTS:
                if port in laid:
                    inputs[view_input_name(view, port)] = laid[port]
        return inputs

    def conversation(
        self,
        turns: list[tuple[str, list[Image.Image]]],
        *,
        max_tokens: int = 512,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        think: bool = False,
    ) -> Request:
        """An answer to the last of ``turns`` ((text, images shown before it), oldest first): the context
        is each turn's ViT spans then its text turn, then ``<|im_start|>`` (the reference's first decode
        query). Greedy by default (as the reference answers); ``sampling`` may set a temperature.
        ``think``: the understanding think prompt comes first; the answer then holds its reasoning."""
        if not turns:
            raise ValueError("a conversation needs a turn")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        parts: list[Part] = [self._system(UNDERSTAND_THINK_PROMPT)] if think else []
        shown: list[torch.Tensor] = []
        for n, (text, images) in enumerate(turns):
            for image in images:
                prepared = self.prepare_image(image)
                parts.append(ImagePart("vit", self.vit_rows(prepared)))
                shown.append(prepared.vit)
            last = n == len(turns) - 1
            if text.strip() or last:
                parts.append(self._turn(text, "question" if last else "an earlier turn"))
        parts.append(TextPart((self.tokenizer.special.im_start,)))
        inputs = self._views({"llm": parts})
        if shown:  # every image's ViT rows in one encoder call; the context node puts each in its span
            inputs |= _packed("vit", shown)
        params = sampling or SamplingParams(temperature=0.0, max_tokens=max_tokens)
        # "thinker_max_tokens": the key the gateway reads to tell a reply cut at the cap (finish_reason length)
        meta = {"task": "understand" if shown else "chat", "max_tokens": max_tokens, "thinker_max_tokens": max_tokens}
        return _request(inputs, params, meta, request_id)

    def understand(
        self,
        image: Image.Image | None,
        question: str,
        *,
        max_tokens: int = 512,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        think: bool = False,
    ) -> Request:
        """One question, about ``image`` if given (the reference's understanding)."""
        turn = (question, [image] if image is not None else [])
        return self.conversation([turn], max_tokens=max_tokens, sampling=sampling, request_id=request_id, think=think)

    def generate(
        self,
        prompt: str,
        *,
        size: tuple[int, int] | None = None,
        guidance: GuidanceParams | None = None,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        request_id: str | None = None,
        report_every: int = 0,
        previews: int = 0,
    ) -> Request:
        """Text to image; ``size`` (height, width), default the largest square the model makes.
        ``report_every`` > 0 streams the latent after every k-th flow step (``latent_step``, ``flow_step``);
        ``previews`` streams that many preview images (``preview``) spread over the flow."""
        g = guidance or GuidanceParams()
        side = self.dims.max_latent_size * self.downsample
        height, width = self.check_size(*(size or (side, side)))
        turn = self._turn(prompt, "prompt")
        text_on, image_on = _branches_used(g)
        params = GenerationParams(
            g,
            height // self.downsample,
            width // self.downsample,
            "main" if image_on else "none",
            report_every,
            previews,
        )
        inputs = self._views({"llm": [turn]})  # no-text context: empty; no-image context: the full one
        return self._image_request(inputs, params, text_on, seed, noise, request_id, "t2i")

    def edit(
        self,
        image: Image.Image | Sequence[Image.Image],
        prompt: str,
        *,
        guidance: GuidanceParams | None = None,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        request_id: str | None = None,
        report_every: int = 0,
        previews: int = 0,
    ) -> Request:
        """An edited image of ``image`` (or of several images, in order, then the prompt): the output has the
        last image's (VAE-resized) size, as the reference's. Default guidance: the reference app's edit
        settings (image scale 2.0, interval (0, 1], text_channel renorm). ``report_every`` / ``previews``:
        as for ``generate``."""
        images = [image] if isinstance(image, Image.Image) else list(image)
        return self.edit_interleaved(
            [*images, prompt],
            guidance=guidance,
            seed=seed,
            noise=noise,
            request_id=request_id,
            report_every=report_every,
            previews=previews,
        )

    def edit_interleaved(
        self,
        inputs: Sequence[str | Image.Image],
        *,
        guidance: GuidanceParams | None = None,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        request_id: str | None = None,
        report_every: int = 0,
        previews: int = 0,
    ) -> Request:
        """An image from texts and images in order (the reference's ``interleave_inference`` input list), at
        least one image, ending in a text; the three contexts as it builds them
        (mstar_graphs.bagel.interleaved_contexts). Other arguments: as ``edit``'s."""
        g = guidance or GuidanceParams(image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")
        built = self._interleaved(inputs, None)
        text_on, image_on = _branches_used(g)
        height, width = built.size
        params = GenerationParams(
            g,
            height // self.downsample,
            width // self.downsample,
            "view" if image_on else "none",
            report_every,
            previews,
        )
        views, starts = self._edit_views(built.contexts)
        request_inputs = built.inputs | self._views(views, starts)
        request = self._image_request(request_inputs, params, text_on, seed, noise, request_id, "edit")
        return self._mark_shared(request, starts)

    def _interleaved(self, inputs: Sequence[str | Image.Image], system: TextPart | None) -> _Interleaved:
        """Texts and images in order -> their contexts, the images' encoder inputs, the last image's size."""
        if not inputs or not isinstance(inputs[-1], str):
            raise ValueError("an edit's inputs must end with its prompt (a text)")
        images = [item for item in inputs if isinstance(item, Image.Image)]
        if not images:
            raise ValueError("image: an edit needs an input image")
        if len(images) > MAX_INPUT_IMAGES:
            raise ValueError(f"image: {len(images)} input images, at most {MAX_INPUT_IMAGES}")
        items: list[Input] = []
        prepared: list[PreparedImage] = []
        for n, item in enumerate(inputs):
            if isinstance(item, str):
                items.append(self._turn(item, "prompt" if n == len(inputs) - 1 else f"text {n}"))
            elif isinstance(item, Image.Image):
                image = self.prepare_image(item)
                prepared.append(image)
                items.append((ImagePart("vae", self.vae_rows(image)), ImagePart("vit", self.vit_rows(image))))
            else:
                raise ValueError(f"input {n}: a text or a PIL image, got {type(item).__name__}")
        for i, image in enumerate(prepared):  # every image must fit the model's latent grid
            self.check_size(*image.size, field="image" if len(prepared) == 1 else f"image[{i}]")
        size = prepared[-1].size  # the output's: the last image's, as the reference's image_shapes
        encoder_inputs = _packed("vae", [p.vae for p in prepared]) | _packed("vit", [p.vit for p in prepared])
        return _Interleaved(generation_contexts(items, system), encoder_inputs, size)

    # ------------------------------------------------------------- think mode

    def _system(self, prompt: str) -> TextPart:
        return TextPart(tuple(self.tokenizer.text_turn(prompt)))

    def think(
        self,
        prompt: str,
        image: Image.Image | Sequence[Image.Image] | None = None,
        *,
        size: tuple[int, int] | None = None,
        guidance: GuidanceParams | None = None,
        max_think_tokens: int = MAX_THINK_TOKENS,
        request_id: str | None = None,
        session_id: str | None = None,
    ) -> ThinkPlan:
        """The first request of a thinking generation (or edit, with ``image``: one or several, shown before
        the prompt): the three contexts with the generation think prompt first, then the thought decoded
        greedily (output ``thought_ids``) on a copy of the full context. Submit ``plan.request``, then
        ``after_thought(plan, thought_ids)``."""
        if isinstance(max_think_tokens, bool) or not isinstance(max_think_tokens, int) or max_think_tokens < 1:
            raise ValueError(f"max_think_tokens must be an integer >= 1, got {max_think_tokens!r}")
        system, turn = self._system(GENERATE_THINK_PROMPT), self._turn(prompt, "prompt")
        images = [] if image is None else [image] if isinstance(image, Image.Image) else list(image)
        starts: dict[str, int] = {}
        if not images:
            g = guidance or GuidanceParams()
            side = self.dims.max_latent_size * self.downsample
            height, width = self.check_size(*(size or (side, side)))
            full: list[Part] = [system, turn]
            contexts: dict[str, list[Part]] = {"llm": full}
            inputs: dict[str, torch.Tensor] = {}
        else:
            g = guidance or GuidanceParams(image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")
            built = self._interleaved([*images, prompt], system)
            (height, width), inputs, full = built.size, dict(built.inputs), built.contexts.full
            contexts, starts = self._edit_views(built.contexts)  # an edit's prefill fills every view
        self._check_steps(g)
        text_on, image_on = _branches_used(g)
        # the no-image context differs from the full one here (the thought goes to the full one only)
        params = GenerationParams(
            g, height // self.downsample, width // self.downsample, "view" if image_on else "none"
        )
        if not images and text_on:
            contexts |= {"llm_cfg_text": [system], "llm_cfg_img": [system, turn]}
        inputs |= self._views(contexts, starts)
        inputs[THINK_INPUT] = torch.tensor([self.tokenizer.special.im_start])
        task = "t2i" if not images else "edit"
        meta = {"task": "think", "source": task, "guided": text_on, "max_tokens": max_think_tokens}
        rid = request_id if request_id is not None else f"bagel-think-{next(_counter)}"
        sid = session_id or rid
        request = _request(inputs, SamplingParams(temperature=0.0, max_tokens=max_think_tokens), meta, rid)
        request.priority = Priority.BATCH  # the plan of an image: part of the image's job
        request.session_id = sid
        request.outputs = frozenset({"thought_ids"})
        self._mark_shared(request, starts)
        next_position = view_inputs(full, self.markers).next_position
        return ThinkPlan(request, sid, task, params, text_on, next_position)

    def thought(self, ids: list[int]) -> str:
        """The thought's text from the think view's tokens (mstar_graphs.bagel.think_requests.thought_text)."""
        return thought_text(self.tokenizer, [int(i) for i in ids])

    def after_thought(
        self,
        plan: ThinkPlan,
        thought_ids: list[int],
        *,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        request_id: str | None = None,
        report_every: int = 0,
        previews: int = 0,
    ) -> Request:
        """The second request (same session): the thought's text re-tokenized as one text turn, appended to
        the full context only, then the image (``report_every`` / ``previews``: as ``generate``'s)."""
        turn = self.tokenizer.text_turn(self.thought(thought_ids))
        start = plan.next_position
        inputs = {
            "ids": torch.tensor(turn, dtype=torch.long),
            "rope_positions": torch.arange(start, start + len(turn))[None],
        }
        rid = request_id if request_id is not None else f"{plan.request.request_id}-image"
        params = dataclasses.replace(plan.params, report_every=report_every, previews=previews)
        request = self._image_request(inputs, params, plan.guided, seed, noise, rid, plan.task)
        request.session_id = plan.session_id
        request.meta["continued"] = True
        return request

    # --------------------------------------------------------------- shared

    def _edit_views(self, contexts: GenerationContexts) -> tuple[dict[str, list[Part]], dict[str, int]]:
        """An edit's three views. The full view forks the no-text view's KV (its prefix) and takes only the
        rest (positions from the no-text counter on), unless the views sit apart (``cfg_parallel``): then it
        is laid out whole. Returns the views' parts and the forked views' starts."""
        views = {"llm": contexts.full, "llm_cfg_text": contexts.no_text, "llm_cfg_img": contexts.no_image}
        rest = contexts.after_no_text()
        if self.cfg_parallel or not rest:
            return views, {}
        start = view_inputs(contexts.no_text, self.markers).next_position
        return views | {"llm": rest}, {"llm": start}

    @staticmethod
    def _mark_shared(request: Request, starts: dict[str, int]) -> Request:
        """Request meta that makes the full view fork the no-text view (the walk ``prefill_vae_shared``)."""
        if "llm" in starts:
            request.meta[SHARED_PREFIX_KEY] = SHARED_PREFIX_VIEW
        return request

    def _check_steps(self, g: GuidanceParams) -> None:
        if g.steps > MAX_STEPS:
            raise ValueError(f"steps must be at most {MAX_STEPS}, got {g.steps}")

    def _image_request(self, inputs, params: GenerationParams, guided: bool, seed, noise, request_id, task) -> Request:
        self._check_steps(params.guidance)
        shape = (params.num_tokens, self.token_width)
        if noise is None:
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            noise = torch.randn(shape, generator=generator)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise must be {shape} for this size, got {tuple(noise.shape)}")
        inputs |= {"noise": noise.float(), "gen_params": params.pack()}
        meta = {"task": task, "guided": guided}
        if self.cfg_parallel:
            meta["cfg_parallel"] = True
        request = _request(inputs, SamplingParams(temperature=0.0, max_tokens=1, seed=seed), meta, request_id)
        request.priority = Priority.BATCH  # an image takes seconds and no one hears it stream: it yields to others
        return request


@dataclass(frozen=True)
class _Interleaved:
    contexts: GenerationContexts
    inputs: dict[str, torch.Tensor]  # the encoders' request inputs
    size: tuple[int, int]  # (height, width) of the output: the last image's


def _packed(encoder: str, images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """An encoder's request inputs for ``images`` (``vit_image`` [+ ``vit_sizes``], ``vae_image`` ...)."""
    image, sizes = pack_images(images)
    return {f"{encoder}_image": image} | ({} if sizes is None else {f"{encoder}_sizes": sizes})


def _branches_used(g: GuidanceParams) -> tuple[bool, bool]:
    """(any guidance at all, the image branch): the reference applies none unless the text scale is > 1."""
    text_on = g.text_scale > 1.0
    return text_on, text_on and g.image_scale > 1.0


_counter = iter(range(1 << 62))


def _request(inputs, sampling: SamplingParams, meta: dict, request_id: str | None) -> Request:
    rid = request_id if request_id is not None else f"bagel-{next(_counter)}"
    return Request(inputs, sampling, request_id=rid, meta=meta)
