"""Flow Loops in the AR engine: Euler steps over the persisted prefix KV, batched across requests."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request, RequestError
from mstar.engine.attention.metadata import MaskKind
from mstar.graph import LoopMode
from mstar.sampling_params import SamplingParams
from support.conductor_helpers import config, run
from support.toy_flow import ToyFlowLM, flow_graph

STEPS = 4
H, A, W = ToyFlowLM.action_horizon, ToyFlowLM.action_dim, 32


def observation(n: int, seed: int, guide: bool = False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (n,), generator=g)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[: n // 2] = True  # the first half enters as "image" embeddings
    embeds = torch.randn(int(mask.sum()), W, generator=g)
    noise = torch.randn(H, A, generator=g)
    guide_actions = torch.randn(H, A, generator=g)
    weights = torch.tensor([1.0, 1.0, 0.5, 0.0, 0.0, 0.0]) if guide else torch.zeros(H)
    return ids, embeds, mask, noise, guide_actions, weights


def request(obs, rid: str) -> Request:
    ids, embeds, mask, noise, guide, weights = obs
    return Request(
        {"ids": ids, "embeds": embeds, "embed_mask": mask, "noise": noise, "guide": guide, "guide_weights": weights},
        SamplingParams(max_tokens=1),
        request_id=rid,
        meta={"prefix.mask": int(MaskKind.PREFIX_BIDIRECTIONAL), "prefix.mask_arg": len(ids)},
    )


def reference(lm: ToyFlowLM, obs):
    ids, embeds, mask, noise, guide, weights = obs
    with torch.no_grad():
        return lm.reference_actions(ids.tolist(), embeds, mask, noise, STEPS, guide, weights)


async def serve(lm, observations, **cfg):
    async with Conductor(flow_graph(STEPS), {"lm": lm}, config=config(dtype="float32", **cfg)) as c:
        outs = await asyncio.gather(*(c.submit(request(o, f"r{i}")).collect() for i, o in enumerate(observations)))
        await c.wait_idle()
        stats = c.stats()["workers"][0]["ar:lm"]
    return [o["actions"][0] for o in outs], stats


def test_flow_over_persisted_prefix_kv_equals_recomputing_the_prefix_every_step():
    lm = ToyFlowLM()
    observations = [observation(n, seed) for seed, n in enumerate([5, 11, 8, 17])]
    got, stats = run(serve(lm, observations))
    for actions, obs in zip(got, observations):
        assert actions.shape == (H, A)
        assert torch.allclose(actions, reference(lm, obs), atol=1e-5), float((actions - reference(lm, obs)).abs().max())
    # each prefix was computed once, not once per Euler step
    assert stats["tokens_computed"] == sum(len(o[0]) for o in observations)
    assert lm.prefix_rows == sum(len(o[0]) for o in observations)


def test_concurrent_flows_share_batched_evaluations():
    lm = ToyFlowLM()
    observations = [observation(9, seed) for seed in range(6)]

    async def go():
        async with Conductor(flow_graph(STEPS), {"lm": lm}, config=config(dtype="float32")) as c:
            engine = c.workers[0].ar_engines["lm"]
            outs = await asyncio.gather(*(c.submit(request(o, f"r{i}")).collect() for i, o in enumerate(observations)))
            return outs, engine.loops[LoopMode.FLOW].evaluations

    outs, evaluations = run(go())
    assert len(outs) == 6
    assert evaluations < 6 * STEPS  # robots' flows step together, not one after another


def test_guided_flow_keeps_the_committed_actions():
    lm = ToyFlowLM()
    obs = observation(7, 3, guide=True)
    (actions,), _ = run(serve(lm, [obs]))
    guide = obs[4]
    assert torch.allclose(actions[:2], guide[:2], atol=1e-6)  # weight 1: exactly the executed actions
    assert not torch.allclose(actions[3:], guide[3:], atol=1e-2)  # weight 0: free
    assert torch.allclose(actions, reference(lm, obs), atol=1e-5)


def test_flow_waits_for_kv_and_never_preempts_a_running_flow():
    lm = ToyFlowLM()
    observations = [observation(n, seed) for seed, n in enumerate([13, 9, 15, 7, 11])]
    got, stats = run(serve(lm, observations, num_kv_blocks=14))  # 4-token blocks: not all at once
    assert stats["preemptions"] > 0
    for actions, obs in zip(got, observations):
        assert torch.allclose(actions, reference(lm, obs), atol=1e-5)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"noise": torch.full((H, A), float("nan"))}, "NaN"),
        ({"noise": torch.zeros(H + 1, A)}, r"\(noise\) has shape"),
        ({"embeds": torch.full((3, W), float("inf"))}, "embeds contain NaN"),
        ({"embed_mask": torch.ones(3, dtype=torch.bool)}, "embed_mask marks"),
    ],
)
def test_bad_flow_inputs_fail_clearly_and_the_next_request_is_served(bad, message):
    lm = ToyFlowLM()
    good = observation(6, 0)

    async def go():
        async with Conductor(flow_graph(STEPS), {"lm": lm}, config=config(dtype="float32")) as c:
            req = request(good, "bad")
            req.inputs.update(bad)
            with pytest.raises(RequestError, match=message):
                await c.submit(req).collect()
            out = await c.submit(request(good, "good")).collect()
            await c.wait_idle()
            return out

    out = run(go())
    assert torch.allclose(out["actions"][0], reference(lm, good), atol=1e-5)


def test_a_bidirectional_prefix_is_never_split_over_steps():
    lm = ToyFlowLM()
    observations = [observation(n, seed) for seed, n in enumerate([17, 13, 9])]
    got, _ = run(serve(lm, observations, max_batched_tokens=8))  # less than each prefix
    for actions, obs in zip(got, observations):
        assert torch.allclose(actions, reference(lm, obs), atol=1e-5)
