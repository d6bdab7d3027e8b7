"""The benchmark's baseline (pi0.5 called directly, dense prefix K/V) == the chunk our runtime serves."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar_graphs.pi05.direct import DenseKV, sample_actions_direct
from mstar_graphs.pi05.frontend import Pi05Policy
from support.parity import FP32


@pytest.fixture(scope="module")
def policy() -> Pi05Policy:
    return Pi05Policy.load(progress=False)  # the tiny generated checkpoint, fp32


def _observation(seed: int, cameras: int):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (cameras, 224, 224, 3), generator=g, dtype=torch.uint8)
    return images, torch.rand(8, generator=g) * 2 - 1


def test_direct_equals_the_served_chunk(policy):
    requests = [
        policy.request(*_observation(s, cameras), prompt, seed=s)
        for s, cameras, prompt in ((0, 2, "pick up the cup"), (1, 1, "open the top drawer"))
    ]

    async def serve():
        async with Conductor(policy.graph(), policy.modules(), config=FP32) as c:
            outs = await asyncio.gather(*(c.submit(r).collect() for r in requests))
            await c.wait_idle()
            return [out["actions"][0] for out in outs]

    served = asyncio.run(serve())
    for req, chunk in zip(requests, served):
        i = req.inputs
        direct = sample_actions_direct(
            policy.model, policy.encoder, i["images"], i["input_ids"], i["embed_mask"], i["noise"]
        )
        assert direct.shape == (policy.action_horizon, policy.action_dim)
        err = float((direct - chunk).abs().max())
        assert err < 1e-4, err
        assert float((direct - i["noise"]).abs().max()) > 0.1  # the flow moved: not a trivial match


def test_dense_kv_keeps_the_prefix_and_attends_to_it():
    kv = DenseKV()
    q, k, v = torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    kv(0, q, k, v, 8**-0.5)
    kv.recording = False
    qs, ks, vs = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    out = kv(0, qs, ks, vs, 8**-0.5)
    keys = torch.cat([k, ks]).repeat_interleave(2, dim=1)  # GQA: 2 query heads per KV head
    vals = torch.cat([v, vs]).repeat_interleave(2, dim=1)
    ref = torch.einsum("qhk,khd->qhd", (torch.einsum("qhd,khd->qhk", qs, keys) * 8**-0.5).softmax(-1), vals)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert kv.k[0].shape == (2, 5, 8)  # the prefix K/V, unchanged by the suffix pass
