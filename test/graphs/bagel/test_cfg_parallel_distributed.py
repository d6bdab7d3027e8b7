"""BAGEL's guidance views on three Worker processes (config/placement/bagel-cfg-parallel.yaml, the Walk-driven
flow) vs the engine-resident guided flow in one process and vs the naive reference: same final latents."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from mstar.conductor import Conductor
from mstar_graphs.bagel import reference
from mstar_graphs.bagel.components import bagel_spec
from mstar_graphs.bagel.frontend import BagelModel
from mstar_graphs.bagel.guidance import GuidanceParams
from mstar_graphs.bagel.latent_tokens import latent_pos_ids
from support.parity import FP32

PLACEMENT = Path(__file__).parents[3] / "config" / "placement" / "bagel-cfg-parallel.yaml"
T2I = GuidanceParams(steps=6, interval=(0.5, 1.0))  # the last step unguided
EDIT = GuidanceParams(steps=6, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")
PROMPT, INSTRUCTION = "a red cube on a table", "make the sky green"


def _picture() -> Image.Image:
    y, x = np.mgrid[0:32, 0:48]
    return Image.fromarray(np.stack([x * 5 % 256, y * 6 % 256, (x * y) % 256], -1).astype(np.uint8))


def _requests(bagel: BagelModel) -> list:
    return [
        bagel.requests.generate(PROMPT, size=(32, 64), guidance=T2I, seed=3, request_id="t2i"),
        bagel.requests.edit(_picture(), INSTRUCTION, guidance=EDIT, seed=4, request_id="edit"),
    ]


def _serve(conductor: Conductor, requests: list) -> tuple[list[torch.Tensor], dict[int, int]]:
    """Final latents of ``requests`` served together, and each rank's velocity calls."""

    async def run():
        async with conductor:
            outs = await asyncio.gather(*(conductor.submit(r).collect() for r in requests))
            await conductor.wait_idle(timeout=10)
            calls = {w.rank: w.stats().get("ar:bagel", {}).get("flow_velocity_calls", 0) for w in conductor.workers}
        return [o["latent"][-1] for o in outs], calls

    return asyncio.run(asyncio.wait_for(run(), 120))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _reference(bagel: BagelModel, state, requests: list) -> list[torch.Tensor]:
    modules = bagel.modules()
    markers = (bagel.tokenizer.special.vision_start, bagel.tokenizer.special.vision_end)
    prepared = bagel.requests.prepare_image(_picture())
    with torch.no_grad():
        vae = ("gen_rows", modules["vae_encoder"](prepared.vae[None])["embeds"][0])
        vit = ("und_rows", modules["vit_encoder"](prepared.vit[None])["embeds"][0])
    prompt, instruction = (("text", bagel.tokenizer.text_turn(t)) for t in (PROMPT, INSTRUCTION))
    cases = [
        ({"gen": [prompt], "cfg_text": [], "cfg_img": [prompt]}, T2I, (32, 64)),
        ({"gen": [vae, vit, instruction], "cfg_text": [vae, vit], "cfg_img": [instruction]}, EDIT, (32, 48)),
    ]
    side, grid = 8 * bagel.config.dims.latent_patch_size, bagel.config.dims.max_latent_size
    latent = modules["bagel"].latent
    out = []
    for request, (contexts, params, (h, w)) in zip(requests, cases):
        ids = latent_pos_ids(h, w, side, grid)
        with torch.no_grad():
            steps = reference.ref_generate_latents(
                state,
                bagel.config.llm,
                contexts,
                request.inputs["noise"],
                lambda x, t, ids=ids: latent(x, t, ids),
                params,
                markers,
            )
        out.append(steps[-1])
    return out


def test_views_on_three_workers_give_the_latents_of_the_batched_flow_and_the_reference(ckpt, state):
    batched_model = BagelModel.load(ckpt, progress=False)
    batched, _ = _serve(
        Conductor(batched_model.graph(), batched_model.modules(), config=FP32), _requests(batched_model)
    )
    split_model = BagelModel.load(ckpt, progress=False, requests_only=True, placement=PLACEMENT)  # views apart: on
    split_requests = _requests(split_model)
    assert all(r.meta["cfg_parallel"] for r in split_requests)
    conductor = Conductor.distributed(bagel_spec(ckpt, dtype="float32"), PLACEMENT, config=FP32)
    split, calls = _serve(conductor, split_requests)
    # t2i: 5 main evaluations + 4 guided no-text; edit: 5 of each of the three branches
    assert calls == {0: 10, 1: 9, 2: 5}
    wanted = _reference(batched_model, state, split_requests)
    for got, same, want in zip(split, batched, wanted):
        assert _rel(got, same) < 1e-5
        assert _rel(got, want) < 1e-4
    assert _rel(split[0], split_requests[0].inputs["noise"]) > 1e-1  # the flow moved the state
