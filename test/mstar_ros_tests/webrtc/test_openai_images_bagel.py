"""/v1/images/generations with the real (tiny, random) BAGEL on a Conductor: ``stream`` with ``partial_images``
sends the model's preview decodes while the flow runs, then the completed image - the same image a request
without previews gets."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import PIL.Image
import pytest
from aiohttp import ClientSession

from mstar_graphs.bagel.frontend import BagelModel
from mstar_graphs.bagel.tiny import write_tiny_bagel
from support.webrtc_gateway import gateway_for


@pytest.fixture(scope="module")
def bagel(tmp_path_factory) -> BagelModel:
    return BagelModel.load(write_tiny_bagel(tmp_path_factory.mktemp("bagel") / "ckpt"), progress=False)


def pixels_of(b64: str) -> np.ndarray:
    return np.asarray(PIL.Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def test_stream_sends_two_previews_then_the_completed_image(bagel):
    body = {"prompt": "a red fox", "size": "32x32", "steps": 6, "seed": 3}

    async def main():
        async with gateway_for(bagel, model_name="bagel") as (_, _, url), ClientSession() as s:
            streamed = {**body, "stream": True, "partial_images": 2}
            async with s.post(f"{url}/v1/images/generations", json=streamed) as r:
                status, kind, text = r.status, r.headers["Content-Type"], await r.text()
            async with s.post(f"{url}/v1/images/generations", json=body) as r:
                whole = await r.json()
            return status, kind, text, whole

    status, kind, text, whole = asyncio.run(asyncio.wait_for(main(), 120))
    assert status == 200 and kind.startswith("text/event-stream"), text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.get("partial_image_index") for e in events[:2]] == [0, 1]
    images = [pixels_of(e["b64_json"]) for e in events]
    assert all(im.shape == (32, 32, 3) for im in images)
    # real previews: two different decodes, neither the final image
    assert not np.array_equal(images[0], images[1])
    assert not np.array_equal(images[0], images[2]) and not np.array_equal(images[1], images[2])
    assert np.array_equal(images[2], pixels_of(whole["data"][0]["b64_json"]))  # previews change nothing
