"""The image-generation recipe: BagelLLM over persisted context KVs + guidance.py vs the reference's
full-recompute ``ref_generate_latents`` (its own layout, schedule and CFG copy).

Our side prefills each context (gen, cfg_text, cfg_img) once into its own KV; every flow step
evaluates the N+2 query rows against each active branch without writing them (as the reference's
``update_past_key_values=False``), combines, and takes the Euler step.
"""

from __future__ import annotations

import pytest
import torch

from mstar_graphs.bagel import reference
from mstar_graphs.bagel.guidance import GuidanceParams, branches_active, combine, timesteps
from support.bagel_contexts import next_rope, run_parts
from support.dense_kv_attention import DenseKVAttention

N = 4  # latent tokens of the generated image


def _embedder(seed: int = 11):
    """A stand-in latent embedder (the vision side's): x [N, 64], t -> [N, 64] rows."""
    g = torch.Generator().manual_seed(seed)
    weight, time_row, pos = (
        torch.randn(64, 64, generator=g) / 8,
        torch.randn(64, generator=g),
        torch.randn(N, 64, generator=g),
    )

    def embed(x: torch.Tensor, t: float) -> torch.Tensor:
        return x @ weight + t * time_row + pos

    return embed


@torch.no_grad()
def generate(model, contexts, noise, embed, params: GuidanceParams, markers) -> list[torch.Tensor]:
    caches, ropes = {}, {}
    for name, parts in contexts.items():
        caches[name] = DenseKVAttention(len(model.model.layers))
        run_parts(model, caches[name], parts, markers)
        ropes[name] = next_rope(parts)
    ids = torch.tensor([markers[0], *([0] * N), markers[1]])
    mask = torch.tensor([False, *([True] * N), False])
    kinds = mask.long()
    times = timesteps(params.steps, params.timestep_shift)
    x, out = noise.clone(), []
    for i in range(params.steps - 1):
        t = float(times[i])
        rows = torch.zeros(N + 2, 64)
        rows[1:-1] = embed(x, t)

        def velocity(branch: str, rows: torch.Tensor = rows) -> torch.Tensor:
            cache = caches[branch]
            cache.causal, cache.frozen = False, True
            start = len(cache)
            hidden = model(
                ids,
                torch.arange(start, start + N + 2),
                cache,
                embeds=rows,
                embed_mask=mask,
                rope_positions=torch.full((1, N + 2), ropes[branch]),
                row_kinds=kinds,
            )
            return model.velocity_head(hidden[1:-1])

        text_on, image_on = branches_active(params, t)
        v = combine(
            velocity("gen"),
            velocity("cfg_text") if text_on else None,
            velocity("cfg_img") if image_on else None,
            t,
            params,
        )
        x = x - v * (times[i] - times[i + 1])
        out.append(x)
    return out


def _rows(seed: int, n: int) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("task", "params"),
    [
        ("t2i", GuidanceParams(steps=8, text_scale=4.0, image_scale=1.5, interval=(0.4, 1.0), renorm="global")),
        ("edit", GuidanceParams(steps=4, text_scale=4.0, image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")),
        ("edit", GuidanceParams(steps=4, text_scale=3.0, image_scale=1.0, renorm="channel", renorm_min=0.5)),
    ],
)
def test_flow_with_guidance_matches_reference(model, state, config, tok, markers, task, params):
    prompt = ("text", tok.text_turn("add snow on the road"))
    if task == "t2i":  # facts 5.6: cfg_text is the empty context, cfg_img the same as gen
        contexts = {"gen": [prompt], "cfg_text": [], "cfg_img": [prompt]}
    else:
        image = [("gen_rows", _rows(1, 4)), ("und_rows", _rows(2, 3))]
        contexts = {"gen": [*image, prompt], "cfg_text": image, "cfg_img": [prompt]}
    noise = _rows(3, N)
    embed = _embedder()
    ours = generate(model, contexts, noise, embed, params, markers)
    ref = reference.ref_generate_latents(state, config.llm, contexts, noise, embed, params, markers)
    assert len(ours) == len(ref) == params.steps - 1
    for a, b in zip(ours, ref):
        assert float((a - b).abs().max()) < 1e-5, float((a - b).abs().max())
    # guidance changed the result (the test would notice a branch left out)
    plain = reference.ref_generate_latents(
        state, config.llm, contexts, noise, embed, GuidanceParams(steps=params.steps, text_scale=1.0), markers
    )
    assert float((plain[-1] - ref[-1]).abs().max()) > 1e-3
