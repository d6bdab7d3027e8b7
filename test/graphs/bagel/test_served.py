"""BAGEL served by the Conductor (views, spans, row kinds, the guided flow Loop) vs the naive reference.

The reference (mstar_graphs.bagel.reference) recomputes every context densely per token / per flow step
and runs the three contexts' forwards one after another; the served path prefills each view once into
its own paged KV and evaluates the branches of every request in one engine step. Images go through our
vision modules on both sides (those match ByteDance's code: tools/bagel_reference_run.py).
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
from support.parity import FP32

T2I = GuidanceParams(steps=6, interval=(0.5, 1.0))  # global renorm; the last steps unguided
EDIT = GuidanceParams(steps=6, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")


def _picture(width: int = 50, height: int = 40) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 5 % 256, y * 6 % 256, (x * y) % 256], -1).astype(np.uint8)
    return Image.fromarray(rgb)


@pytest.fixture(scope="module")
def bagel(ckpt) -> BagelModel:
    return BagelModel.load(ckpt, progress=False)


async def _outputs(conductor: Conductor, request) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    async for item in conductor.submit(request):
        out.setdefault(item.name, []).append(item.data)
    return out


def _serve(bagel: BagelModel, requests: list) -> list[dict[str, list[torch.Tensor]]]:
    async def run():
        conductor = await Conductor(bagel.graph(), bagel.modules(), config=FP32).start()
        try:
            return await asyncio.gather(*(_outputs(conductor, r) for r in requests))
        finally:
            await conductor.stop()

    return asyncio.run(run())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


class _Reference:
    """The reference's side of each task, from the same prepared images and noise."""

    def __init__(self, bagel: BagelModel, state) -> None:
        self.bagel, self.sd = bagel, state
        self.cfg = bagel.config.llm
        self.markers = (bagel.tokenizer.special.vision_start, bagel.tokenizer.special.vision_end)
        modules = bagel.modules()
        self.vit = modules["vit_encoder"]
        self.vae = modules["vae_encoder"]
        self.llm = modules["bagel"]

    @torch.no_grad()
    def vit_rows(self, image: Image.Image) -> torch.Tensor:
        return self.vit(self.bagel.requests.prepare_image(image).vit[None])["embeds"][0]

    @torch.no_grad()
    def vae_rows(self, image: Image.Image) -> torch.Tensor:
        return self.vae(self.bagel.requests.prepare_image(image).vae[None])["embeds"][0]

    def turn(self, text: str) -> tuple[str, list[int]]:
        return ("text", self.bagel.tokenizer.text_turn(text))

    def answer(self, image: Image.Image, question: str, new_tokens: int) -> list[int]:
        parts = [("und_rows", self.vit_rows(image)), self.turn(question)]
        got = reference.ref_understand(self.sd, self.cfg, self.bagel.tokenizer, parts, new_tokens + 1)
        return got.tokens[1:]  # after the <|im_start|> query

    @torch.no_grad()
    def latents(self, contexts, noise: torch.Tensor, params: GuidanceParams, height: int, width: int):
        latent = self.llm.latent
        side = 8 * self.bagel.config.dims.latent_patch_size
        from mstar_graphs.bagel.latent_tokens import latent_pos_ids

        ids = latent_pos_ids(height, width, side, self.bagel.config.dims.max_latent_size)
        return reference.ref_generate_latents(
            self.sd, self.cfg, contexts, noise, lambda x, t: latent(x, t, ids), params, self.markers
        )


@pytest.fixture(scope="module")
def ref(bagel, state) -> _Reference:
    return _Reference(bagel, state)


def test_understanding_tokens_equal_the_reference(bagel, ref):
    image = _picture()
    request = bagel.requests.understand(image, "What is in the picture?", max_tokens=6)
    (out,) = _serve(bagel, [request])
    served = [int(t) for t in out["text_ids"]]
    assert served == ref.answer(image, "What is in the picture?", 6)[: len(served)]
    assert len(served) >= 1


def test_text_to_image_and_edit_latents_equal_the_reference_alone_and_batched(bagel, ref):
    image = _picture(48, 32)
    t2i = bagel.requests.generate("a red cube on a table", size=(32, 64), guidance=T2I, seed=3)
    edit = bagel.requests.edit(image, "make the sky green", guidance=EDIT, seed=4)
    ask = bagel.requests.understand(image, "Describe it.", max_tokens=4)
    alone = [_serve(bagel, [r])[0] for r in (t2i, edit)]
    t2i.request_id, edit.request_id, ask.request_id = "t2i-b", "edit-b", "ask-b"
    batched = _serve(bagel, [t2i, edit, ask])

    turn = ref.turn("a red cube on a table")
    want_t2i = ref.latents({"gen": [turn], "cfg_text": [], "cfg_img": [turn]}, t2i.inputs["noise"], T2I, 32, 64)[-1]
    vae, vit, instr = (
        ("gen_rows", ref.vae_rows(image)),
        ("und_rows", ref.vit_rows(image)),
        ref.turn("make the sky green"),
    )
    want_edit = ref.latents(
        {"gen": [vae, vit, instr], "cfg_text": [vae, vit], "cfg_img": [instr]}, edit.inputs["noise"], EDIT, 32, 48
    )[-1]
    unguided = ref.latents(
        {"gen": [turn], "cfg_text": [], "cfg_img": [turn]},
        t2i.inputs["noise"],
        GuidanceParams(steps=6, text_scale=1.0),
        32,
        64,
    )[-1]
    assert _rel(unguided, want_t2i) > 1e-2  # guidance really changes the latents
    for got in (alone[0], batched[0]):
        assert _rel(got["latent"][0], want_t2i) < 1e-4
        assert tuple(got["image"][0].shape) == (32, 64, 3) and got["image"][0].dtype == torch.uint8
    for got in (alone[1], batched[1]):
        assert _rel(got["latent"][0], want_edit) < 1e-4
        assert tuple(got["image"][0].shape) == (32, 48, 3)
    for a, b in ((alone[0], batched[0]), (alone[1], batched[1])):  # batched rows round differently: 1 level
        assert int((a["image"][0].int() - b["image"][0].int()).abs().max()) <= 1
    assert len(batched[2]["text_ids"]) >= 1


def test_decoded_image_is_the_vae_decode_of_the_latent(bagel):
    request = bagel.requests.generate("a boat", size=(32, 32), guidance=T2I, seed=5)
    (out,) = _serve(bagel, [request])
    from mstar_graphs.bagel.latent_tokens import to_uint8_image, unpatchify_latent

    vae = bagel.modules()["vae_decoder"].vae
    with torch.no_grad():
        z = unpatchify_latent(out["latent"][0], 2, 2, 2, 16)
        want = to_uint8_image(vae.decode(z[None])[0])
    assert torch.equal(out["image"][0], want)


def _predicted(states: list[torch.Tensor], noise: torch.Tensor, times: torch.Tensor, step: int) -> torch.Tensor:
    """The clean latent predicted after ``step`` (1-based) from the reference's states: x - t * v, with v the
    velocity that step took (rectified flow: x_t = (1 - t) x0 + t noise)."""
    x = [noise.float(), *states]
    v = (x[step] - x[step - 1]) / float(times[step] - times[step - 1])
    return x[step] - float(times[step]) * v


def test_the_latent_after_every_step_and_the_previews_equal_the_reference(bagel, ref):
    from mstar_graphs.bagel.guidance import timesteps
    from mstar_graphs.bagel.latent_tokens import to_uint8_image, unpatchify_latent

    image = _picture(48, 32)
    t2i = bagel.requests.generate("a red cube", size=(32, 32), guidance=T2I, seed=7, report_every=1, previews=2)
    edit = bagel.requests.edit(image, "make it blue", guidance=EDIT, seed=8, report_every=1, previews=2)
    plain = bagel.requests.generate("a red cube", size=(32, 32), guidance=T2I, seed=7)
    got_t2i, got_edit, got_plain = _serve(bagel, [t2i, edit, plain])

    turn = ref.turn("a red cube")
    want_t2i = ref.latents({"gen": [turn], "cfg_text": [], "cfg_img": [turn]}, t2i.inputs["noise"], T2I, 32, 32)
    vae, vit, instr = ("gen_rows", ref.vae_rows(image)), ("und_rows", ref.vit_rows(image)), ref.turn("make it blue")
    want_edit = ref.latents(
        {"gen": [vae, vit, instr], "cfg_text": [vae, vit], "cfg_img": [instr]}, edit.inputs["noise"], EDIT, 32, 48
    )
    decoder = bagel.modules()["vae_decoder"].vae
    times = timesteps(6, T2I.timestep_shift)
    for got, want, request, (h, w) in ((got_t2i, want_t2i, t2i, (2, 2)), (got_edit, want_edit, edit, (2, 3))):
        assert len(want) == 5 and len(got["latent_step"]) == 5  # every step, the last included
        assert [int(s) for s in got["flow_step"]] == [1, 2, 3, 4, 5]
        for step, (a, b) in enumerate(zip(got["latent_step"], want), start=1):
            assert _rel(a, b) < 1e-4, step
        assert torch.equal(got["latent_step"][-1], got["latent"][0])
        # two previews, before the last step (steps 2 and 3 of 5): the decoded predicted clean latents
        assert len(got["preview"]) == 2 and len(got["image"]) == 1
        for preview, step in zip(got["preview"], (2, 3)):
            clean = _predicted(want, request.inputs["noise"], times, step)
            with torch.no_grad():
                expected = to_uint8_image(decoder.decode(unpatchify_latent(clean, h, w, 2, 16)[None])[0])
            diff = (preview.int() - expected.int()).abs()
            assert preview.shape == got["image"][0].shape and int(diff.max()) <= 2, int(diff.max())
            assert not torch.equal(preview, got["image"][0])  # a preview, not the final image
    assert "latent_step" not in got_plain and "preview" not in got_plain  # only when asked
    assert torch.equal(got_plain["latent"][0], got_t2i["latent"][0])  # and the final latent is the same


def test_an_edit_prefills_its_image_once_the_full_context_forking_the_no_text_one(bagel, ref):
    """The no-text context [VAE span, ViT span] is the full one's prefix: the full view forks its KV and
    computes only the instruction (the engine's prefill rows say so); the latents stay the reference's.
    With ``cfg_parallel`` (views apart) the request lays out the full context whole."""
    image = _picture(48, 32)
    edit = bagel.requests.edit(image, "make the sky green", guidance=EDIT, seed=4)
    instruction = bagel.tokenizer.text_turn("make the sky green")
    assert edit.meta["llm.kv_from"] == "llm_cfg_text" and edit.inputs["ids"].tolist() == instruction
    no_text = int(edit.inputs["cfg_text_ids"].numel())
    assert edit.inputs["rope_positions"].tolist() == [list(range(2, 2 + len(instruction)))]  # after 2 spans

    async def run():
        conductor = await Conductor(bagel.graph(), bagel.modules(), config=FP32).start()
        try:
            out = await _outputs(conductor, edit)
            await conductor.wait_idle(timeout=10)
            return out, conductor.workers[0].stats()["ar:bagel"]
        finally:
            await conductor.stop()

    out, stats = asyncio.run(run())
    vae, vit, instr = (
        ("gen_rows", ref.vae_rows(image)),
        ("und_rows", ref.vit_rows(image)),
        ref.turn("make the sky green"),
    )
    want = ref.latents(
        {"gen": [vae, vit, instr], "cfg_text": [vae, vit], "cfg_img": [instr]}, edit.inputs["noise"], EDIT, 32, 48
    )[-1]
    assert _rel(out["latent"][0], want) < 1e-4
    assert stats["tokens_computed"] == no_text + 2 * len(instruction)  # no-text, no-image, the instruction
    assert stats["kv_blocks_used"] == 0 and stats["sequences"] == 0  # every fork let go of its blocks
    apart = BagelModel.load(bagel.path, progress=False, requests_only=True, cfg_parallel=True).requests.edit(
        image, "make the sky green", guidance=EDIT, seed=4
    )
    assert "llm.kv_from" not in apart.meta and int(apart.inputs["ids"].numel()) == no_text + len(instruction)


def test_without_a_stop_token_answers_run_to_their_length(bagel):
    """``graph(stop_at_im_end=False)`` (the bench on random weights): an answer is as long as asked even
    where the served graph would end it - here with the answer's second token taken as the end token."""
    from mstar_graphs.bagel.graph import bagel_graph

    request = bagel.requests.understand(_picture(), "What is in the picture?", max_tokens=6)

    def answer(graph) -> list[int]:
        async def run():
            conductor = await Conductor(graph, bagel.modules(), config=FP32).start()
            try:
                request.request_id = f"ask-{id(graph)}"
                return [int(t) for t in (await _outputs(conductor, request))["text_ids"]]
            finally:
                await conductor.stop()

        return asyncio.run(run())

    full = answer(bagel.graph(stop_at_im_end=False))
    assert len(full) == 6
    assert answer(bagel_graph(full[1])) == full[:1]  # that graph ends the answer at its "end token"
