"""The tiny BAGEL (``BagelModel.load()``, random weights) served on 127.0.0.1 and driven by the official
``openai`` client: images made and edited, questions about an image answered (streamed and not), its
guidance and think options, and bad input refused with a 400 naming the field while the server goes
on serving."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import zlib

import numpy as np
import openai
import PIL.Image
import pytest
from aiohttp import ClientSession

from mstar_graphs.bagel.frontend import BagelModel
from support.webrtc_gateway import gateway_for

FAST = {"steps": 2}  # our extension: two schedule points, one flow evaluation


@pytest.fixture(scope="module")
def bagel() -> BagelModel:
    return BagelModel.load(progress=False)


def run(coro, timeout: float = 120.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def decoded(b64: str) -> PIL.Image.Image:
    image = PIL.Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def png_bytes(width: int = 40, height: int = 32) -> bytes:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 6 % 256, y * 8 % 256, (x * y) % 256], -1).astype(np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def huge_header_png(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (valid CRC) over a tiny body: judged before decoding."""
    raw = bytearray(png_bytes(8, 8))
    ihdr = struct.pack(">II", width, height) + bytes(raw[24:29])
    raw[16:29] = ihdr
    raw[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(raw)


def data_url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def test_images_and_answers_through_the_openai_client(bagel):
    async def main():
        async with gateway_for(bagel, model_name="bagel") as (_, _, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            made = await client.images.generate(model="bagel", prompt="a fox", n=2, size="64x64", extra_body=FAST)
            tall = {}
            for fmt in ("png", "jpeg", "webp"):
                tall[fmt] = await client.images.generate(
                    prompt="a fox", size="48x64", output_format=fmt, extra_body={**FAST, "seed": 1}
                )
            edited = await client.images.edit(
                image=("in.png", png_bytes(), "image/png"),
                prompt="make it blue",
                extra_body={**FAST, "guidance": {"text_scale": 3.0, "interval": [0.0, 1.0], "renorm": "global"}},
            )
            thought = await client.images.generate(
                prompt="a cat", size="32x32", extra_body={**FAST, "think": True, "guidance": {"image_scale": 1.0}}
            )
            messages = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": data_url(png_bytes())}},
                    ],
                }
            ]
            answer = await client.chat.completions.create(model="bagel", messages=messages, max_tokens=4)
            chunks = await client.chat.completions.create(
                model="bagel", messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
            )
            streamed = [chunk async for chunk in chunks]
            async with ClientSession() as s, s.get(f"{url}/v1/models") as r:
                models = await r.json()
            await client.close()
            return made, tall, edited, thought, answer, streamed, models

    made, tall, edited, thought, answer, streamed, models = run(main())
    assert made.size == "64x64" and [decoded(d.b64_json).size for d in made.data] == [(64, 64)] * 2
    for fmt, response in tall.items():
        image = decoded(response.data[0].b64_json)
        assert image.format == fmt.upper() and image.size == (48, 64)
    want = bagel.image_size(None, [(40, 32)])
    assert edited.size == f"{want[0]}x{want[1]}" and decoded(edited.data[0].b64_json).size == want
    assert isinstance(thought.data[0].revised_prompt, str)  # the thought, returned with the image
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens >= 1
    assert answer.usage.prompt_tokens > 0 and isinstance(answer.choices[0].message.content, str)
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason in ("stop", "length") for c in streamed)
    (entry,) = [m for m in models["data"] if m["id"] == "bagel"]
    assert entry["random_weights"] is True


BAD_GENERATIONS = [  # (extra fields, the param the 400 names)
    ({"size": "50x64"}, "size"),  # not a multiple of 16
    ({"size": "1024x1024"}, "size"),  # over the model's largest side
    ({"size": "0x64"}, "size"),
    ({"n": 5}, "n"),  # over the model's 4
    ({"n": 11}, "n"),  # over OpenAI's 10
    ({"steps": 251}, "steps"),  # over the model's 250
    ({"steps": 0}, "steps"),
    ({"guidance": {"text_scale": 0}}, "guidance.text_scale"),
    ({"guidance": {"text_scale": -2}}, "guidance.text_scale"),
    ({"guidance": {"image_scale": "NaN"}}, "guidance.image_scale"),
    ({"guidance": {"timestep_shift": "inf"}}, "guidance.timestep_shift"),
    ({"guidance": {"renorm": "local"}}, "guidance.renorm"),
    ({"guidance": {"interval": [0.2, 1.5]}}, "guidance.interval"),
    ({"guidance": {"interval": [0.8, 0.2]}}, "guidance.interval"),
    ({"guidance": {"renorm_min": 2}}, "guidance.renorm_min"),
    ({"guidance": {"cfg": 1}}, "guidance.cfg"),
    ({"guidance": 3}, "guidance"),
    ({"think": "maybe"}, "think"),
]


def test_bad_input_is_a_400_naming_the_field_and_the_server_goes_on(bagel):
    async def main():
        async with gateway_for(bagel, model_name="bagel") as (_, _, url):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

            async def good() -> bool:
                made = await client.images.generate(prompt="a fox", size="32x32", extra_body=FAST)
                return decoded(made.data[0].b64_json).size == (32, 32)

            refused = []
            for fields, _ in BAD_GENERATIONS:
                size = fields.get("size", "32x32")
                extra = {**FAST, **{k: v for k, v in fields.items() if k != "size"}}
                try:
                    await client.images.generate(prompt="a fox", size=size, extra_body=extra)
                    refused.append((None, None, False))
                except openai.BadRequestError as exc:
                    refused.append((exc.status_code, exc.param, await good()))
            edits = []
            for raw in (b"\x89PNG\r\n\x1a\nbroken", huge_header_png(9000, 9000), png_bytes()[:60]):
                try:
                    await client.images.edit(image=("x.png", raw, "image/png"), prompt="p", extra_body=FAST)
                    edits.append(None)
                except openai.BadRequestError as exc:
                    edits.append((exc.param, str(exc)))
            try:
                await client.images.edit(
                    image=("x.png", png_bytes(), "image/png"),
                    prompt="p",
                    extra_body={**FAST, "guidance": {"interval": [0.5, 2]}},
                )
                form = None
            except openai.BadRequestError as exc:
                form = exc.param
            async with ClientSession() as s:  # what no JSON encoder of a client makes, sent raw
                body = b'{"prompt": "a fox", "size": "32x32", "steps": 2, "guidance": {"text_scale": 1e999}}'
                headers = {"Content-Type": "application/json"}
                async with s.post(f"{url}/v1/images/generations", data=body, headers=headers) as r:
                    overflow = r.status, await r.json()
            after = await good()
            await client.close()
            return refused, edits, form, overflow, after

    refused, edits, form, overflow, after = run(main(), timeout=300)
    for (fields, param), (status, got, served_next) in zip(BAD_GENERATIONS, refused):
        assert (status, got) == (400, param), fields
        assert served_next, fields  # a good request right after is answered
    assert [e[0] if e else None for e in edits] == ["image", "image", "image"], edits
    assert "over the limit" in edits[1][1]  # judged from the header, before decoding
    assert form == "guidance.interval"  # the option sent as multipart fields, as the client flattens it
    assert overflow[0] == 400 and "out of range" in overflow[1]["error"]["message"]
    assert after
