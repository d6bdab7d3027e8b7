"""The tiny BAGEL on 127.0.0.1 through the official ``openai`` client with several input images: a chat
message with two ``image_url`` parts answered, an edit of two ``image[]`` files made at the last image's
size, and over the limits a 400 naming the field (``image`` for an edit's files, ``messages`` for chat)."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import openai
import PIL.Image
import pytest

from mstar_graphs.bagel.frontend import BagelModel
from support.webrtc_gateway import gateway_for

FAST = {"steps": 2}  # two schedule points, one flow evaluation


@pytest.fixture(scope="module")
def bagel() -> BagelModel:
    return BagelModel.load(progress=False)


def png_bytes(width: int, height: int, k: int = 1) -> bytes:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 6 * k % 256, y * 8 % 256, (x * y + k) % 256], -1).astype(np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def image_part(raw: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(raw).decode()}}


def test_two_images_in_a_chat_and_an_edit_and_a_400_over_the_limit(bagel):
    first, second = png_bytes(40, 32), png_bytes(32, 48, k=2)

    async def main():
        async with gateway_for(bagel, model_name="bagel") as (_, _, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            two = [{"type": "text", "text": "Which is brighter?"}, image_part(first), image_part(second)]
            answer = await client.chat.completions.create(
                model="bagel", messages=[{"role": "user", "content": two}], max_tokens=3
            )
            one = [{"type": "text", "text": "Which is brighter?"}, image_part(first)]
            single = await client.chat.completions.create(
                model="bagel", messages=[{"role": "user", "content": one}], max_tokens=3
            )
            edited = await client.images.edit(
                image=[("a.png", first, "image/png"), ("b.png", second, "image/png")],
                prompt="put the first inside the second",
                extra_body=FAST,
            )
            refused = {}
            try:
                files = [(f"{i}.png", png_bytes(16, 16, k=i), "image/png") for i in range(bagel.max_input_images + 1)]
                await client.images.edit(image=files, prompt="too many", extra_body=FAST)
            except openai.BadRequestError as exc:
                refused["edit"] = (exc.status_code, exc.param, str(exc))
            try:
                many = [{"type": "text", "text": "?"}] + [image_part(png_bytes(8, 8, k=i)) for i in range(9)]
                await client.chat.completions.create(model="bagel", messages=[{"role": "user", "content": many}])
            except openai.BadRequestError as exc:
                refused["chat"] = (exc.status_code, exc.param, str(exc))
            await client.close()
            return answer, single, edited, refused

    answer, single, edited, refused = asyncio.run(asyncio.wait_for(main(), 180))
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens >= 1
    assert answer.usage.prompt_tokens > single.usage.prompt_tokens  # the second image's rows are in the context
    want = bagel.image_size(None, [(40, 32), (32, 48)])  # the last image's size after the VAE resize rule
    assert want == bagel.image_size(None, [(32, 48)]) != bagel.image_size(None, [(40, 32)])
    image = PIL.Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json)))
    assert edited.size == f"{want[0]}x{want[1]}" and image.size == want
    status, param, message = refused["edit"]
    assert (status, param) == (400, "image") and f"at most {bagel.max_input_images}" in message
    assert refused["chat"][:2] == (400, "messages") and "9 images" in refused["chat"][2]
