"""pi0.5 served through the Conductor: observation in, action chunk out, equal to the dense reference."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, RequestError
from mstar_graphs.pi05.frontend import Pi05Policy
from mstar_graphs.pi05.reference import sample_actions
from support.parity import FP32


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    return Pi05Policy.load(progress=False)


def observation(seed: int, cameras: int = 2):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (cameras, 224, 224, 3), generator=g, dtype=torch.uint8)
    state = torch.rand(8, generator=g) * 2 - 1
    return images, state


def test_chunks_for_several_robots_equal_the_reference(policy):
    observations = [observation(s) for s in range(3)]
    prompts = ["pick up the cup", "open the drawer", "stack the blocks"]
    requests = [policy.request(img, st, p, seed=i) for i, ((img, st), p) in enumerate(zip(observations, prompts))]

    async def go():
        async with Conductor(policy.graph(), policy.modules(), config=FP32) as c:
            outs = await asyncio.gather(*(c.submit(r).collect() for r in requests))
            await c.wait_idle()
            return outs

    outs = asyncio.run(go())
    for req, out in zip(requests, outs):
        (actions,) = out["actions"]
        assert actions.shape == (policy.action_horizon, policy.action_dim)
        with torch.no_grad():
            embeds = policy.encoder(policy.encoder.prepare_inputs([_call(req)])["pixel_values"])["embeds"][0]
            expected = sample_actions(
                policy.model,
                req.inputs["input_ids"],
                req.inputs["noise"],
                embeds=embeds,
                embed_mask=req.inputs["embed_mask"],
            )
        assert torch.allclose(actions, expected, atol=1e-4), float((actions - expected).abs().max())


def _call(req):
    from mstar.graph.node import NodeCall

    return NodeCall(req.request_id, {"images": req.inputs["images"]})


def test_bad_observations_are_refused_and_serving_goes_on(policy):
    images, state = observation(0)
    with pytest.raises(ValueError, match="prompt"):
        policy.request(images, state, "   ")
    with pytest.raises(ValueError, match="NaN"):
        policy.request(images, torch.full((8,), float("nan")), "go")
    with pytest.raises(ValueError, match="images must be"):
        policy.request(images[..., :2], state, "go")

    async def go():
        async with Conductor(policy.graph(), policy.modules(), config=FP32) as c:
            bad = policy.request(torch.zeros(2, 224, 224, 3, dtype=torch.uint8), state, "go", seed=1)
            bad.inputs["noise"] = torch.full_like(bad.inputs["noise"], float("nan"))
            with pytest.raises(RequestError, match="NaN"):
                await c.submit(bad).collect()
            out = await c.submit(policy.request(images, state, "go", seed=2)).collect()
            await c.wait_idle()
            return out

    out = asyncio.run(go())
    assert out["actions"][0].shape == (policy.action_horizon, policy.action_dim)
