"""The BAGEL bench's baseline: ByteDance's inferencer algorithm, run on our modules and kernels.

What ``inferencer.py`` / ``bagel.py`` do, one request at a time (restated, not copied):

- **editing** (``interleave_inference([image, text])``): the full context gets the image's VAE span, then
  its ViT span (two LLM calls); the no-text context is a deep copy of it; then the instruction turn is
  appended to the full context and, separately, to the no-image context (which holds only it). Each
  flow step runs the full context's N + 2 rows, then the no-text context's, then the no-image
  context's: three batch-1 forwards, each over its own KV (the last two only inside the guidance
  interval), then the guidance combination and the Euler step; finally the VAE decodes.
- **text to image** (``[text]``): the prompt turn goes to the full context and, separately, to the
  no-image context (the same tokens); the no-text context stays empty. A guided step runs all three
  forwards (the no-image one equals the full one: the reference computes it anyway).
- **chat** (``understanding_output=True``): the ViT span (one call), the question turn (another), then
  ``<|im_start|>`` and token-by-token greedy decoding, one forward per token, until ``<|im_end|>`` or the cap.

The modules are the served path's own objects (cast and packed by its engines), the attention the
engine's backend (mstar_ros.bench.bagel_contexts), the guidance ``mstar_graphs.bagel.guidance.combine``:
only the scheduling differs. Context prefills skip the last layer's unused MLP, as ours do (the
reference computes it: a small advantage given to the baseline). Call on the device thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mstar_graphs.bagel.context_layout import ImagePart, Markers, TextPart
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.guidance import branches_active, combine
from mstar_graphs.bagel.latent_tokens import to_uint8_image, unpatchify_latent
from mstar_ros.bench.bagel_contexts import Context, ContextPool, flow_velocities


@dataclass
class ImageResult:
    seconds: float
    latent: torch.Tensor  # [N, p*p*C] the final latent tokens
    image: torch.Tensor  # [H, W, 3] uint8
    forwards: int  # batch-1 flow forwards run


@dataclass
class ChatResult:
    seconds: float  # the whole answer (the reference returns it whole)
    first_token_s: float  # when its loop had the first token (what a streaming version could send)
    tokens: list[int]  # every sampled token (an ending <|im_end|> included)


class ReferenceBagel:
    """The reference's recipes over ``modules`` (``bagel``, ``vit_encoder``, ``vae_encoder``, ``vae_decoder``)."""

    def __init__(self, modules, markers: Markers, im_start: int, im_end: int | None, kv_rows: int) -> None:
        """``im_end`` None: chat answers run to their ``max_tokens`` (the bench's random weights)."""
        self.llm = modules["bagel"]
        self.vit = modules["vit_encoder"]
        self.vae_encoder = modules["vae_encoder"]
        self.vae_decoder = modules["vae_decoder"]
        self.im_start, self.im_end = im_start, im_end
        self.pool = ContextPool(self.llm, markers, kv_rows)

    # ------------------------------------------------------------------ contexts

    def edit_contexts(self, vae_image: torch.Tensor, vit_image: torch.Tensor, turn: list[int]) -> dict[str, Context]:
        vae_rows = self.vae_encoder(vae_image[None])["embeds"][0]
        vit_rows = self.vit(vit_image[None])["embeds"][0]
        gen = self.pool.context()
        gen.extend([ImagePart("vae", vae_rows.shape[0])], vae_rows)
        gen.extend([ImagePart("vit", vit_rows.shape[0])], vit_rows)
        cfg_text = gen.copy()
        gen.extend([TextPart(tuple(turn))])
        cfg_img = self.pool.context()
        cfg_img.extend([TextPart(tuple(turn))])
        return {"gen": gen, "cfg_text": cfg_text, "cfg_img": cfg_img}

    def t2i_contexts(self, turn: list[int]) -> dict[str, Context]:
        gen, cfg_img = self.pool.context(), self.pool.context()
        gen.extend([TextPart(tuple(turn))])
        cfg_img.extend([TextPart(tuple(turn))])
        return {"gen": gen, "cfg_text": self.pool.context(), "cfg_img": cfg_img}

    def free(self, contexts: dict[str, Context]) -> None:
        for context in contexts.values():
            context.free()

    # -------------------------------------------------------------------- images

    @torch.inference_mode()
    def edit(self, vae_image, vit_image, turn: list[int], noise: torch.Tensor, gen_params: torch.Tensor) -> ImageResult:
        start = time.perf_counter()
        contexts = self.edit_contexts(vae_image, vit_image, turn)
        return self._generate(contexts, noise, gen_params, start)

    @torch.inference_mode()
    def text_to_image(self, turn: list[int], noise: torch.Tensor, gen_params: torch.Tensor) -> ImageResult:
        start = time.perf_counter()
        return self._generate(self.t2i_contexts(turn), noise, gen_params, start)

    def _generate(self, contexts: dict[str, Context], noise, gen_params, start: float) -> ImageResult:
        try:
            latent, forwards = self.flow(contexts, noise, gen_params)
            image = self.decode(latent, gen_params)
        finally:
            self.free(contexts)
        return ImageResult(time.perf_counter() - start, latent, image, forwards)

    def flow(self, contexts: dict[str, Context], noise: torch.Tensor, gen_params: torch.Tensor):
        """Euler over the shifted schedule; each evaluation one batch-1 forward per branch the step needs."""
        inputs = {"gen_params": gen_params}
        guidance = GenerationParams.unpack(gen_params).guidance
        plan = self.llm.flow_plan(inputs)
        times = plan.timesteps.tolist()
        x = noise.float().clone()
        forwards = 0
        for i in range(len(times) - 1):
            t = times[i]
            text_on, image_on = branches_active(guidance, t)
            names = ["gen"] + ["cfg_text"] * text_on + ["cfg_img"] * image_on
            v = {
                name: flow_velocities(self.pool, [contexts[name]], x, t, inputs, plan, i)[0] for name in names
            }  # one after another: the reference's loop
            forwards += len(names)
            velocity = combine(v["gen"], v.get("cfg_text"), v.get("cfg_img"), t, guidance)
            x = x + (times[i + 1] - t) * velocity.float()
        return x, forwards

    def decode(self, latent: torch.Tensor, gen_params: torch.Tensor) -> torch.Tensor:
        params = GenerationParams.unpack(gen_params)
        node = self.vae_decoder
        z = unpatchify_latent(latent, params.grid_h, params.grid_w, node.latent_patch, node.latent_channels)
        dtype = next(node.vae.parameters()).dtype
        return to_uint8_image(node.vae.decode(z[None].to(dtype))[0])

    # ---------------------------------------------------------------------- chat

    @torch.inference_mode()
    def chat(self, vit_image: torch.Tensor, turn: list[int], max_tokens: int) -> ChatResult:
        start = time.perf_counter()
        context = self.pool.context()
        try:
            rows = self.vit(vit_image[None])["embeds"][0]
            context.extend([ImagePart("vit", rows.shape[0])], rows)
            context.extend([TextPart(tuple(turn))])
            token, tokens, first = self.im_start, [], 0.0
            while len(tokens) < max_tokens:
                hidden = context.decode(token)
                token = int(self.llm.compute_logits(hidden[-1:]).argmax(-1))
                tokens.append(token)
                first = first or time.perf_counter() - start
                if token == self.im_end:
                    break
        finally:
            context.free()
        return ChatResult(time.perf_counter() - start, first, tokens)
