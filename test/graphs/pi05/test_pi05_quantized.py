"""pi0.5 served with quantized linears (its expert reads a linear's bias for the device and dtype):
the chunk stays near the unquantized direct one, by as much as each mode's rounding allows."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import torch

from mstar.conductor import Conductor
from mstar_graphs.pi05.direct import sample_actions_direct
from mstar_graphs.pi05.frontend import Pi05Policy
from support.parity import FP32


@pytest.fixture(scope="module")
def reference() -> Pi05Policy:
    return Pi05Policy.load(progress=False)


# measured max abs error of the chunk against fp32 (tiny checkpoint, fp32 weights): fp16 1.8e-3 (11-bit
# weights), int8 3.2e-2, int8_dynamic 4.5e-2; a broken kernel or layout is off by the chunk's size (~1)
@pytest.mark.parametrize("mode, bound", [("fp16", 1e-2), ("int8", 0.1), ("int8_dynamic", 0.15)])
def test_the_quantized_chunk_stays_near_the_unquantized_one(reference, mode, bound):
    policy = Pi05Policy.load(progress=False)  # its own modules: the engine quantizes them in place
    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (2, 224, 224, 3), generator=g, dtype=torch.uint8)
    request = policy.request(images, torch.rand(8, generator=g) * 2 - 1, "pick up the cup", seed=3)

    async def serve():
        async with Conductor(
            policy.graph(), policy.modules(), config=msgspec.structs.replace(FP32, quantization=mode)
        ) as c:
            return (await c.submit(request).collect())["actions"][0]

    chunk = asyncio.run(serve())
    i = request.inputs
    exact = sample_actions_direct(
        reference.model, reference.encoder, i["images"], i["input_ids"], i["embed_mask"], i["noise"]
    )
    err = float((chunk - exact).abs().max())
    assert torch.isfinite(chunk).all() and err < bound, err
    assert float((exact - i["noise"]).abs().max()) > 0.1  # the flow moved: the bound is not trivially met
