"""BAGEL's think mode served (two requests of one session: the thought on a fork of the full context,
then the image after the re-tokenized thought) vs the reference's recipe (reference.ref_think_contexts)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from mstar.conductor import Conductor
from mstar_graphs.bagel import reference
from mstar_graphs.bagel.frontend import BagelModel
from mstar_graphs.bagel.guidance import GuidanceParams
from mstar_graphs.bagel.latent_tokens import latent_pos_ids
from mstar_graphs.bagel.think_prompts import GENERATE_THINK_PROMPT, UNDERSTAND_THINK_PROMPT
from mstar_graphs.bagel.think_requests import thought_text
from support.parity import FP32

THINK_TOKENS = 5
T2I = GuidanceParams(steps=4, interval=(0.3, 1.0))  # text and image guidance (the image branch: its own view)
EDIT = GuidanceParams(steps=4, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")


@pytest.fixture(scope="module")
def bagel(ckpt) -> BagelModel:
    return BagelModel.load(ckpt, progress=False)


def _picture(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([x * 7 % 256, y * 3 % 256, (x + y) % 256], -1).astype(np.uint8))


def _served(bagel: BagelModel, plan) -> tuple[list[int], dict, int]:
    async def run():
        conductor = await Conductor(bagel.graph(), bagel.modules(), config=FP32).start()
        try:
            ids = [int(o.data) async for o in conductor.submit(plan.request)]
            out: dict = {}
            async for o in conductor.submit(bagel.requests.after_thought(plan, ids, seed=2)):
                out.setdefault(o.name, []).append(o.data)
            conductor.close_session(plan.session_id)
            await conductor.wait_idle()
            return ids, out, conductor.kv_blocks_used()
        finally:
            await conductor.stop()

    return asyncio.run(run())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _reference_latent(bagel, state, inputs, noise, params, height, width):
    tok, cfg = bagel.tokenizer, bagel.config.llm
    thought, contexts = reference.ref_think_contexts(state, cfg, tok, inputs, GENERATE_THINK_PROMPT, THINK_TOKENS + 1)
    latent = bagel.modules()["bagel"].latent
    ids = latent_pos_ids(height, width, 8 * bagel.config.dims.latent_patch_size, bagel.config.dims.max_latent_size)
    markers = (tok.special.vision_start, tok.special.vision_end)
    xs = reference.ref_generate_latents(state, cfg, contexts, noise, lambda x, t: latent(x, t, ids), params, markers)
    return thought, xs[-1]


@torch.no_grad()
def test_thinking_text_to_image_equals_the_reference(bagel, state):
    plan = bagel.requests.think("a red cube", size=(32, 48), guidance=T2I, max_think_tokens=THINK_TOKENS)
    ids, out, blocks = _served(bagel, plan)
    noise = bagel.requests.after_thought(plan, ids, seed=2).inputs["noise"]
    thought, want = _reference_latent(bagel, state, [("text", "a red cube")], noise, T2I, 32, 48)
    assert [t for t in ids if t != bagel.tokenizer.special.im_end] == thought.tokens[1:]
    assert thought_text(bagel.tokenizer, ids) == thought.text and len(ids) >= 2  # a thought of some tokens
    assert _rel(out["latent"][0], want) < 1e-4
    assert tuple(out["image"][0].shape) == (32, 48, 3)
    assert blocks == 0  # closing the session freed the contexts' and the thought's KV


@torch.no_grad()
def test_thinking_edit_equals_the_reference(bagel, state):
    image = _picture(40, 32)
    plan = bagel.requests.think("make it blue", image, guidance=EDIT, max_think_tokens=THINK_TOKENS)
    ids, out, _ = _served(bagel, plan)
    noise = bagel.requests.after_thought(plan, ids, seed=2).inputs["noise"]
    modules = bagel.modules()
    prepared = bagel.requests.prepare_image(image)
    spans = [
        ("gen_rows", modules["vae_encoder"](prepared.vae[None])["embeds"][0]),
        ("und_rows", modules["vit_encoder"](prepared.vit[None])["embeds"][0]),
    ]
    h, w = prepared.size
    thought, want = _reference_latent(bagel, state, [("image", spans), ("text", "make it blue")], noise, EDIT, h, w)
    assert [t for t in ids if t != bagel.tokenizer.special.im_end] == thought.tokens[1:]
    assert _rel(out["latent"][0], want) < 1e-4


@torch.no_grad()
def test_thinking_edit_of_two_images_equals_the_reference(bagel, state):
    images = [_picture(40, 32), _picture(32, 48)]
    plan = bagel.requests.think("blend them", images, guidance=EDIT, max_think_tokens=THINK_TOKENS)
    ids, out, _ = _served(bagel, plan)
    noise = bagel.requests.after_thought(plan, ids, seed=2).inputs["noise"]
    modules = bagel.modules()
    inputs = []
    for image in images:
        prepared = bagel.requests.prepare_image(image)
        vae = modules["vae_encoder"](prepared.vae[None])["embeds"][0]
        inputs.append(
            ("image", [("gen_rows", vae), ("und_rows", modules["vit_encoder"](prepared.vit[None])["embeds"][0])])
        )
    h, w = prepared.size  # the last image's
    thought, want = _reference_latent(bagel, state, [*inputs, ("text", "blend them")], noise, EDIT, h, w)
    assert [t for t in ids if t != bagel.tokenizer.special.im_end] == thought.tokens[1:]
    assert _rel(out["latent"][0], want) < 1e-4 and tuple(out["image"][0].shape) == (h, w, 3)


def test_thinking_understanding_puts_the_think_prompt_first(bagel):
    plain = bagel.requests.understand(None, "Why?", max_tokens=3)
    thinking = bagel.requests.understand(None, "Why?", max_tokens=3, think=True)
    system = bagel.tokenizer.text_turn(UNDERSTAND_THINK_PROMPT)
    assert thinking.inputs["ids"].tolist() == system + plain.inputs["ids"].tolist()


def test_thought_text_is_read_between_the_turn_markers(tok):
    hello = tok.encode("hello")
    im_start, im_end = tok.special.im_start, tok.special.im_end
    assert thought_text(tok, [*hello, im_end]) == "hello"
    assert thought_text(tok, [*hello, im_start, *tok.encode("more")]) == "hello"
