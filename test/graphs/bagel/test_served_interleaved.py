"""Several input images per conversation and per edit, served by the Conductor, vs the naive reference with
its contexts built input by input as ``interleave_inference`` builds them (reference.ref_interleave_contexts).

The served side packs the images into one call of each encoder and the context node puts each image's rows
in its spans; the reference encodes each image alone and lays out its contexts from the input list.
"""

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
from support.parity import FP32

EDIT = GuidanceParams(steps=5, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")


def _picture(width: int, height: int, k: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * k % 256, y * (k + 3) % 256, (x * y + k * 40) % 256], -1).astype(np.uint8)
    return Image.fromarray(rgb)


FIRST, SECOND = _picture(48, 32, 5), _picture(32, 48, 9)  # two sizes: the output follows the last


@pytest.fixture(scope="module")
def bagel(ckpt) -> BagelModel:
    return BagelModel.load(ckpt, progress=False)


def _serve(bagel: BagelModel, requests: list) -> list[dict[str, list[torch.Tensor]]]:
    async def run():
        conductor = await Conductor(bagel.graph(), bagel.modules(), config=FP32).start()
        try:
            outs = await asyncio.gather(*(conductor.submit(r).collect() for r in requests))
            await conductor.wait_idle(timeout=10)
            assert conductor.kv_blocks_used() == 0
            return outs
        finally:
            await conductor.stop()

    return asyncio.run(asyncio.wait_for(run(), 120))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@torch.no_grad()
def _rows(bagel: BagelModel, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
    """(VAE rows, ViT rows) of one image, each encoded alone."""
    modules, prepared = bagel.modules(), bagel.requests.prepare_image(image)
    vae = modules["vae_encoder"](prepared.vae[None])["embeds"][0]
    return vae, modules["vit_encoder"](prepared.vit[None])["embeds"][0]


def test_a_question_about_two_images_answers_the_references_tokens(bagel, state):
    turns = [("Here is one.", [FIRST]), ("And two more: which differs?", [SECOND, FIRST])]
    request = bagel.requests.conversation(turns, max_tokens=6)
    assert tuple(request.inputs["vit_sizes"].shape) == (3, 2) and request.inputs["spans"].shape[0] == 3
    (out,) = _serve(bagel, [request])
    inputs = [
        ("image", _rows(bagel, FIRST)),
        ("text", "Here is one."),
        ("image", _rows(bagel, SECOND)),
        ("image", _rows(bagel, FIRST)),
        ("text", "And two more: which differs?"),
    ]
    gen = reference.ref_interleave_contexts(bagel.tokenizer, inputs, understanding=True)["gen"]
    assert [kind for kind, _ in gen].count("und_rows") == 3 and "gen_rows" not in [kind for kind, _ in gen]
    want = reference.ref_understand(state, bagel.config.llm, bagel.tokenizer, gen, 7).tokens[1:]
    served = [int(t) for t in out["text_ids"]]
    assert len(served) >= 1 and served == want[: len(served)]


def _edit_reference(bagel: BagelModel, state, inputs, noise: torch.Tensor, height: int, width: int):
    contexts = reference.ref_interleave_contexts(bagel.tokenizer, inputs)
    latent = bagel.modules()["bagel"].latent
    d = bagel.config.dims
    ids = latent_pos_ids(height, width, 8 * d.latent_patch_size, d.max_latent_size)
    markers = (bagel.tokenizer.special.vision_start, bagel.tokenizer.special.vision_end)
    with torch.no_grad():
        return reference.ref_generate_latents(
            state, bagel.config.llm, contexts, noise, lambda x, t: latent(x, t, ids), EDIT, markers
        )


def test_an_edit_of_two_images_follows_the_reference_every_step(bagel, state):
    edit = bagel.requests.edit(
        [FIRST, SECOND], "put the first inside the second", guidance=EDIT, seed=6, report_every=1
    )
    interleaved = bagel.requests.edit_interleaved(
        [FIRST, "the scene", SECOND, "swap their colours"], guidance=EDIT, seed=7, report_every=1
    )
    apart = BagelModel.load(bagel.path, progress=False, requests_only=True, cfg_parallel=True).requests.edit(
        [FIRST, SECOND], "put the first inside the second", guidance=EDIT, seed=6, request_id="apart"
    )
    assert edit.meta["llm.kv_from"] == "llm_cfg_text" and "llm.kv_from" not in apart.meta
    outs = _serve(bagel, [edit, interleaved, apart])
    first, second = _rows(bagel, FIRST), _rows(bagel, SECOND)
    h, w = bagel.requests.prepare_image(SECOND).size  # the last image's size
    cases = [
        ([("image", first), ("image", second), ("text", "put the first inside the second")], edit, outs[0]),
        (
            [("image", first), ("text", "the scene"), ("image", second), ("text", "swap their colours")],
            interleaved,
            outs[1],
        ),
    ]
    for inputs, request, got in cases:
        want = _edit_reference(bagel, state, inputs, request.inputs["noise"], h, w)
        assert len(got["latent_step"]) == len(want) == EDIT.steps - 1
        for step, (a, b) in enumerate(zip(got["latent_step"], want), start=1):
            assert _rel(a, b) < 1e-4, step
        assert tuple(got["image"][0].shape) == (h, w, 3)
    # the views laid out whole (cfg-parallel's Walk-driven flow): the same latent as the forked views'
    assert _rel(outs[2]["latent"][-1], outs[0]["latent"][-1]) < 1e-4
    one = _edit_reference(bagel, state, cases[0][0][1:], edit.inputs["noise"], h, w)[-1]
    assert _rel(one, outs[0]["latent"][-1]) > 1e-3  # the first image really is in the context


def test_an_edit_is_refused_naming_the_field_over_the_limit_or_without_a_prompt_last(bagel):
    from mstar_graphs.bagel.requests import MAX_INPUT_IMAGES

    assert bagel.max_input_images == MAX_INPUT_IMAGES > 1
    with pytest.raises(ValueError, match=rf"^image: {MAX_INPUT_IMAGES + 1} input images"):
        bagel.requests.edit([FIRST] * (MAX_INPUT_IMAGES + 1), "too many")
    with pytest.raises(ValueError, match="must end with its prompt"):
        bagel.requests.edit_interleaved([FIRST, "a text", SECOND])
    with pytest.raises(ValueError, match="^image: an edit needs"):
        bagel.requests.edit_interleaved(["only text"])
    with pytest.raises(ValueError, match="^text 1 must be a non-empty string"):
        bagel.requests.edit_interleaved([FIRST, " ", SECOND, "the prompt"])
