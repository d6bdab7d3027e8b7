"""/v1/images/edits (multipart as OpenAI's clients send it, and JSON with data URLs), its input images
judged before they are decoded, and the official ``openai`` client against the server, unchanged."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import openai
import PIL.Image
from aiohttp import ClientSession, FormData

from support.images import bomb_png, broken_png, picture
from support.toy_image_model import ToyImageModel, target_image
from support.webrtc_gateway import gateway_for


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def png_of(image: PIL.Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def decoded(b64: str) -> np.ndarray:
    return np.asarray(PIL.Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def form(files: list[tuple[str, bytes]], **fields) -> FormData:
    data = FormData()
    for name, value in fields.items():
        data.add_field(name, str(value))
    for i, (name, raw) in enumerate(files):
        data.add_field(name, raw, filename=f"in{i}.png", content_type="image/png")
    return data


SOURCE = picture(40, 24, seed=1)
EXPECTED = target_image("", (40, 24), np.asarray(SOURCE)).astype(np.uint8)  # the toy edits to the negative


def test_edits_take_multipart_and_json_data_urls():
    url_of = "data:image/png;base64," + base64.b64encode(png_of(SOURCE)).decode()

    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url), ClientSession() as s:
            post = f"{url}/v1/images/edits"
            async with s.post(post, data=form([("image", png_of(SOURCE))], prompt="invert", n=2, seed=3)) as r:
                one = r.status, await r.json()
            two_files = [("image[]", png_of(SOURCE)), ("image[]", png_of(picture(16, 16, seed=2)))]
            async with s.post(post, data=form(two_files, prompt="invert", size="16x8")) as r:
                two = r.status, await r.json()
            body = {"prompt": "invert", "images": [{"image_url": url_of}], "stream": True, "partial_images": 1}
            async with s.post(post, json=body) as r:
                streamed = r.status, await r.text()
            return one, two, streamed

    (status, one), (status_two, two), (status_stream, text) = run(main())
    assert status == 200, one
    assert one["size"] == "40x24" and len(one["data"]) == 2  # auto: the input's size
    assert all(np.array_equal(decoded(d["b64_json"]), EXPECTED) for d in one["data"])
    assert status_two == 200 and two["size"] == "16x8" and decoded(two["data"][0]["b64_json"]).shape == (8, 16, 3)
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert status_stream == 200
    assert [e["type"] for e in events] == ["image_edit.partial_image", "image_edit.completed"]
    assert events[0]["partial_image_index"] == 0
    assert np.array_equal(decoded(events[-1]["b64_json"]), EXPECTED)


def test_edit_refusals_name_their_field():
    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url), ClientSession() as s:
            post, answers = f"{url}/v1/images/edits", []
            good = png_of(SOURCE)
            cases = [
                ([("image", broken_png())], {"prompt": "x"}),  # opens, then fails to decode
                ([("image", b"not an image at all")], {"prompt": "x"}),
                ([("image", bomb_png(9_000, 9_000))], {"prompt": "x"}),  # refused from its header alone
                ([("image", good), ("mask", good)], {"prompt": "x"}),  # the toy takes no mask
                ([("image[]", good)] * 3, {"prompt": "x"}),  # over its 2 input images
                ([], {"prompt": "x"}),
                ([("image", good)], {}),
                ([("image", good)], {"prompt": "x", "n": "0"}),
                ([("image", good)], {"prompt": "x", "size": "13x7"}),
                ([("image", good)], {"prompt": "x", "response_format": "url"}),
                ([("picture", good)], {"prompt": "x"}),
            ]
            for files, fields in cases:
                async with s.post(post, data=form(files, **fields)) as r:
                    answers.append((r.status, await r.json()))
            bad_url = {"prompt": "x", "images": [{"image_url": "data:image/png;base64,@@@"}]}
            file_id = {"prompt": "x", "images": [{"file_id": "file-1"}]}
            for body in (bad_url, file_id):
                async with s.post(post, json=body) as r:
                    answers.append((r.status, await r.json()))
            return answers

    answers = run(main())
    params = ["image", "image", "image", "mask", "image", "image", "prompt", "n", "size", "response_format", "picture"]
    params += ["images[0]", "images[0]"]
    for param, (status, answer) in zip(params, answers):
        assert status == 400, (param, answer)
        assert answer["error"]["param"] == param, (param, answer)
    assert "could not be decoded" in answers[0][1]["error"]["message"]
    assert "over the limit" in answers[2][1]["error"]["message"]


def test_the_openai_client_generates_and_edits_unchanged(tmp_path):
    source = tmp_path / "source.png"
    SOURCE.save(source)

    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            made = await client.images.generate(model="toy-image", prompt="a fox", n=2, size="16x8")
            with open(source, "rb") as f:
                edited = await client.images.edit(model="toy-image", image=f, prompt="invert", output_format="webp")
            stream = await client.images.generate(prompt="a fox", stream=True, partial_images=1, size="8x8")
            kinds = [event.type async for event in stream]
            try:
                await client.images.generate(prompt="a fox", size="13x7")
                refused = None
            except openai.BadRequestError as exc:
                refused = exc
            await client.close()
            return made, edited, kinds, refused

    made, edited, kinds, refused = run(main())
    assert made.size == "16x8" and [decoded(d.b64_json).shape for d in made.data] == [(8, 16, 3)] * 2
    assert edited.output_format == "webp"
    assert np.abs(decoded(edited.data[0].b64_json).astype(int) - EXPECTED.astype(int)).mean() < 20  # lossy webp
    assert kinds == ["image_generation.partial_image", "image_generation.completed"]
    assert refused is not None and refused.param == "size"
