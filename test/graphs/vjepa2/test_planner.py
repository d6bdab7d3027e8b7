"""CEM planning as Meta's MPC does it, batched across robots without changing any robot's plan."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar.graph import LoopMode
from mstar.request import Request
from mstar.sampling_params import SamplingParams
from mstar_graphs.vjepa2.frontend import plan_request
from mstar_graphs.vjepa2.graph import vjepa2_graph
from mstar_graphs.vjepa2.planner import (
    CemEnergy,
    CemParams,
    CemRefit,
    CemSample,
    initial_belief,
    plan_from_belief,
    refit_belief,
    sample_actions,
)
from support.parity import FP32

PARAMS = CemParams(samples=12, topk=3, iterations=3, maxnorm=0.05)


def _modules(encoder, predictor):
    return {
        "encoder": encoder,
        "predictor": predictor,
        "cem_sample": CemSample(),
        "cem_energy": CemEnergy(),
        "cem_refit": CemRefit(),
    }


def test_samples_follow_the_belief_and_the_bounds():
    mean, std = initial_belief(3, PARAMS)
    mean[:, 3], std[:, 3] = 0.5, 0.1
    a = sample_actions(mean, std, CemParams(samples=2000, topk=10), torch.Generator().manual_seed(0))
    assert a.shape == (2000, 3, 7)
    assert torch.all(a[..., 3:6] == 0)  # rotations never sampled
    assert a[..., :3].abs().max() <= 0.05 + 1e-7 and a[..., 6].abs().max() <= 0.75 + 1e-7
    assert abs(float(a[..., 6].mean()) - 0.5) < 0.1 and float(a[..., :3].std()) > 0.02


def test_refit_keeps_the_topk_and_applies_momentum():
    mean, std = initial_belief(2, PARAMS)
    actions = torch.zeros(12, 2, 7)
    actions[:, :, 0] = torch.arange(12.0)[:, None] / 100
    energies = torch.arange(12.0).flip(0)  # the last three samples are best
    new_mean, new_std = refit_belief(actions, energies, mean, std, PARAMS)
    chosen = actions[[9, 10, 11], :, 0]
    assert torch.allclose(new_mean[:, 0], chosen.mean(0) * 0.85)
    assert torch.allclose(new_std[:, 0], chosen.std(0) * 0.85 + 0.05 * 0.15)
    plan = plan_from_belief(torch.tensor([[0.01, 0.0, 0.0, 0.2], [0.0, 0.0, 0.0, -0.6]]))
    assert plan[0, 6] == 0 and plan[1, 6] == pytest.approx(-0.6) and torch.all(plan[:, 3:6] == 0)


def test_bad_parameters_name_the_field():
    with pytest.raises(ValueError, match="topk"):
        CemParams(samples=4, topk=8)
    with pytest.raises(ValueError, match="7 values"):
        CemParams.from_tensor(torch.zeros(3))


def test_cem_with_a_fixed_seed_plans_the_same_batched_as_alone(vj_encoder, vj_predictor):
    g = torch.Generator().manual_seed(0)
    robots = {}
    for name in ("a", "b", "c"):
        images = torch.randint(0, 256, (3, 32, 32, 3), generator=g, dtype=torch.uint8)
        robots[name] = (images, torch.rand(3, 7, generator=g) * 0.2, torch.randn(3, 7, generator=g) * 0.05)
    goal_image = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8)
    mean, std = initial_belief(3, PARAMS)

    async def plans(names: list[str]):
        async with Conductor(vjepa2_graph(), _modules(vj_encoder, vj_predictor), config=FP32) as c:
            goal = (await c.submit(Request({"frames": goal_image}, meta={"walk": "encode"})).collect())["latents"][0]
            for n in names:
                images, states, actions = robots[n]
                await c.submit(
                    Request({"frames": images, "states": states, "actions": actions}, session_id=n)
                ).collect()
            engine = c.workers[0].ar_engines["predictor"]
            forwards = engine.loops[LoopMode.FRAMES].forwards
            outs = await asyncio.gather(
                *(
                    c.submit(
                        Request(
                            {"goal": goal, "mean": mean, "std": std, "params": PARAMS.tensor()},
                            session_id=n,
                            sampling=SamplingParams(seed=11),
                            meta={"iterations": PARAMS.iterations},
                            outputs=frozenset({"plan", "energies"}),
                        )
                    ).collect()
                    for n in names
                )
            )
            return {n: o for n, o in zip(names, outs)}, engine.loops[LoopMode.FRAMES].forwards - forwards

    together, forwards = asyncio.run(plans(["a", "b", "c"]))
    alone = {n: asyncio.run(plans([n]))[0][n] for n in ("a", "b", "c")}
    for n in ("a", "b", "c"):
        assert len(together[n]["plan"]) == PARAMS.iterations
        assert torch.allclose(together[n]["plan"][-1], alone[n]["plan"][-1], atol=1e-5), n
        assert torch.allclose(together[n]["energies"][-1], alone[n]["energies"][-1], atol=1e-5), n
    assert not torch.allclose(together["a"]["plan"][-1], together["b"]["plan"][-1])
    # three robots' rollouts shared forwards: fewer than three separate plans would take
    assert forwards < 3 * PARAMS.iterations * 3
    # the last energies are no worse than the first: CEM moved toward the goal
    for n in ("a", "b", "c"):
        assert float(together[n]["energies"][-1].min()) <= float(together[n]["energies"][0].min()) + 1e-6


def test_a_seed_reproduces_a_plan_and_no_seed_draws_afresh(vj_encoder, vj_predictor):
    """plan_request(seed=...): the same seed, session and goal give the same plan; another seed, or none (the
    runtime draws one per request, as before), another plan (issue 28.19)."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (3, 32, 32, 3), generator=g, dtype=torch.uint8)
    states, actions = torch.rand(3, 7, generator=g) * 0.2, torch.randn(3, 7, generator=g) * 0.05
    goal_image = torch.randint(0, 256, (32, 32, 3), generator=g, dtype=torch.uint8)

    async def plans(seeds: list[int | None]) -> list[torch.Tensor]:
        async with Conductor(vjepa2_graph(), _modules(vj_encoder, vj_predictor), config=FP32) as c:
            goal = (await c.submit(Request({"frames": goal_image}, meta={"walk": "encode"})).collect())["latents"][0]
            await c.submit(Request({"frames": images, "states": states, "actions": actions}, session_id="r")).collect()
            out = []
            for seed in seeds:
                got = await c.submit(plan_request(goal, 2, PARAMS, session_id="r", seed=seed)).collect()
                assert len(got["plan"]) == PARAMS.iterations and got["energies"][-1].shape == (PARAMS.samples,)
                out.append(got["plan"][-1])
            return out

    first, again, other, free1, free2 = asyncio.run(plans([3, 3, 4, None, None]))
    assert torch.equal(first, again)
    assert not torch.equal(first, other) and not torch.equal(free1, free2)
    (later,) = asyncio.run(plans([3]))  # another process' worth of state: a fresh Conductor
    assert torch.allclose(first, later, atol=1e-6)
    with pytest.raises(ValueError, match="seed"):
        plan_request(torch.zeros(4, 8), 2, PARAMS, session_id="r", seed=-1)
