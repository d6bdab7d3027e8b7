"""pi0.5 across Worker processes: the vision tower on one rank, the prefix and flow on another."""

from __future__ import annotations

import asyncio

import torch

from mstar.conductor import Conductor
from mstar_graphs.pi05.components import pi05_spec
from mstar_graphs.pi05.frontend import Pi05Policy
from support.parity import FP32

SPLIT = """world_size: 2
node_groups:
  - {nodes: [prefix, action], ranks: [0]}
  - {nodes: [vision], ranks: [1]}
"""


def test_vision_on_another_process_gives_the_same_chunks(tmp_path):
    policy = Pi05Policy.load(progress=False)
    g = torch.Generator().manual_seed(5)
    requests = [
        policy.request(
            torch.randint(0, 256, (2, 224, 224, 3), generator=g, dtype=torch.uint8),
            torch.rand(8, generator=g) * 2 - 1,
            f"task {i}",
            seed=i,
            request_id=f"r{i}",
        )
        for i in range(3)
    ]

    async def serve(conductor):
        async with conductor:
            outs = await asyncio.gather(*(conductor.submit(r).collect() for r in requests))
            await conductor.wait_idle(timeout=10)
        return [o["actions"][0] for o in outs]

    here = asyncio.run(serve(Conductor(policy.graph(), policy.modules(), config=FP32)))
    path = tmp_path / "split.yaml"
    path.write_text(SPLIT)
    conductor = Conductor.distributed(pi05_spec(), path, config=FP32)
    there = asyncio.run(serve(conductor))
    assert conductor.router.exports("vision", 1, frozenset({"actions"})) == {"embeds": "shm"}
    for a, b in zip(here, there):
        assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())
