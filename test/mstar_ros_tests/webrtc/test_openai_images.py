"""/v1/images/generations for a model that makes images (the toy image model on a real Conductor): PNG,
JPEG and WebP answers, SSE partial images, the refusals naming their field, a second client served
while one streams, a client that leaves cancelling its images, and the routes a non-speaking model has."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import PIL.Image
from aiohttp import ClientSession

from support.toy_image_model import ToyImageModel, target_image
from support.webrtc_gateway import gateway_for


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def picture_of(b64: str) -> PIL.Image.Image:
    image = PIL.Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def events_of(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def post(session: ClientSession, url: str, body) -> tuple[int, dict]:
    async with session.post(f"{url}/v1/images/generations", json=body) as r:
        return r.status, await r.json()


def test_generations_make_n_images_of_the_size_in_each_format():
    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url), ClientSession() as s:
            status, png = await post(
                s, url, {"model": "toy-image", "prompt": "a fox", "n": 2, "size": "16x8", "seed": 5}
            )
            _, again = await post(s, url, {"prompt": "a fox", "n": 2, "size": "16x8", "seed": 5})
            _, jpeg = await post(s, url, {"prompt": "a fox", "output_format": "jpeg", "output_compression": 50})
            _, webp = await post(s, url, {"prompt": "a fox", "output_format": "webp"})
            async with s.get(f"{url}/v1/models") as r:
                models = await r.json()
            async with s.post(f"{url}/v1/audio/speech", json={"input": "hi"}) as r:
                speech = r.status
            async with s.post(f"{url}/offer", json={"sdp": "", "type": "offer"}) as r:
                offer = r.status
            return status, png, again, jpeg, webp, models, speech, offer

    status, png, again, jpeg, webp, models, speech, offer = run(main())
    assert status == 200, png
    assert png["output_format"] == "png" and png["size"] == "16x8" and len(png["data"]) == 2
    images = [picture_of(d["b64_json"]) for d in png["data"]]
    assert all(im.format == "PNG" and im.size == (16, 8) for im in images)
    # the flow ends on the target: the prompt's gradient, exactly
    assert np.array_equal(np.asarray(images[0]), target_image("a fox", (16, 8)).astype(np.uint8))
    assert [d["b64_json"] for d in again["data"]] == [d["b64_json"] for d in png["data"]]  # same seed, same images
    assert png["usage"]["input_tokens"] == len("a fox") and png["usage"]["total_tokens"] == len("a fox")
    assert picture_of(jpeg["data"][0]["b64_json"]).format == "JPEG" and jpeg["size"] == "32x24"  # auto: the model's
    assert picture_of(webp["data"][0]["b64_json"]).format == "WEBP"
    assert [m["id"] for m in models["data"]] == ["toy-image"] and models["data"][0]["random_weights"] is True
    assert speech == 404 and offer == 404  # it does not speak: no speech route, no peers


def test_stream_sends_partial_images_then_completed():
    body = {"prompt": "a fox", "stream": True, "partial_images": 2, "size": "8x8", "steps": 6, "seed": 1}

    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url), ClientSession() as s:
            async with s.post(f"{url}/v1/images/generations", json=body) as r:
                return r.status, r.headers["Content-Type"], await r.text()

    status, kind, text = run(main())
    assert status == 200 and kind.startswith("text/event-stream")
    events = events_of(text)
    assert [e["type"] for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.get("partial_image_index") for e in events[:2]] == [0, 1]
    assert all(e["size"] == "8x8" and e["output_format"] == "png" and e["background"] == "opaque" for e in events)
    assert "event: image_generation.completed" in text
    partial, final = picture_of(events[0]["b64_json"]), picture_of(events[-1]["b64_json"])
    assert final.size == (8, 8) and not np.array_equal(np.asarray(partial), np.asarray(final))  # a preview, earlier
    assert events[-1]["usage"]["input_tokens"] == len("a fox")


def test_refusals_name_their_field():
    cases = [
        ({"n": 1}, "prompt"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "n": 11}, "n"),
        ({"prompt": "x", "n": 5}, "n"),  # over the model's max_images_per_request (4)
        ({"prompt": "x", "size": "13x7"}, "size"),  # the model's: multiples of 8
        ({"prompt": "x", "size": "foo"}, "size"),
        ({"prompt": "x", "response_format": "url"}, "response_format"),
        ({"prompt": "x", "output_format": "gif"}, "output_format"),
        ({"prompt": "x", "output_compression": 50}, "output_compression"),  # png is not compressed
        ({"prompt": "x", "partial_images": 4}, "partial_images"),
        ({"prompt": "x", "style": "vivid"}, "style"),
        ({"prompt": "x", "bogus": 1}, "bogus"),
        ({"prompt": "x", "model": "dall-e-3"}, "model"),
        ({"prompt": "   "}, "prompt"),
    ]

    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url), ClientSession() as s:
            answers = [await post(s, url, body) for body, _ in cases]
            refused = await post(s, url, {"prompt": "refuse"})  # the model's own refusal, before any event
            async with s.post(f"{url}/v1/images/generations", data=b"{not json") as r:
                garbage = r.status, await r.json()
            big = {"prompt": "x" * (70 * 1024)}  # over the route's 64 KiB body limit
            async with s.post(f"{url}/v1/images/generations", json=big) as r:
                too_big = r.status, await r.json()
            return answers, refused, garbage, too_big

    answers, refused, garbage, too_big = run(main())
    for (body, param), (status, answer) in zip(cases, answers):
        assert status in (400, 404), (body, status, answer)
        assert answer["error"]["param"] == param, (body, answer)
        assert answer["error"]["type"] == "invalid_request_error"
    assert refused[0] == 400 and "refuses" in refused[1]["error"]["message"]
    assert garbage[0] == 400 and garbage[1]["error"]["code"] == "invalid_request_body"
    assert too_big[0] == 413 and too_big[1]["error"]["code"] == "request_too_large"


def test_a_second_client_is_served_while_one_streams_and_a_client_that_leaves_cancels():
    slow = {"prompt": "slow", "stream": True, "partial_images": 1, "size": "8x8", "steps": 400, "seed": 2}

    async def main():
        model = ToyImageModel(delay=0.02)  # 400 steps of 20 ms: ~8 s unless cancelled
        async with gateway_for(model, model_name="toy-image") as (conductor, _, url), ClientSession() as s:
            streaming = await s.post(f"{url}/v1/images/generations", json=slow)
            kind = streaming.headers["Content-Type"]  # the stream has begun (after the model's first step)
            status, quick = await post(s, url, {"prompt": "quick", "size": "8x8", "steps": 2})
            still_running = conductor.in_flight > 0
            streaming.close()  # the client goes away mid-stream
            for _ in range(40):  # 2 s: well before the slow one would end
                if not conductor.in_flight:
                    break
                await asyncio.sleep(0.05)
            return kind, status, quick, still_running, conductor.in_flight

    kind, status, quick, still_running, left = run(main())
    assert kind.startswith("text/event-stream")
    assert status == 200 and picture_of(quick["data"][0]["b64_json"]).size == (8, 8)
    assert still_running  # the slow one was still in flight while the quick one was answered
    assert left == 0  # and the one whose client left was cancelled, not run to its end


def test_a_client_that_leaves_before_a_whole_answer_cancels_its_images():
    slow = {"prompt": "slow", "size": "8x8", "steps": 400, "n": 2}

    async def main():
        model = ToyImageModel(delay=0.02)  # 400 steps of 20 ms: ~8 s unless cancelled
        async with gateway_for(model, model_name="toy-image") as (conductor, _, url), ClientSession() as s:
            task = asyncio.ensure_future(s.post(f"{url}/v1/images/generations", json=slow))
            for _ in range(100):
                if conductor.in_flight == 2:
                    break
                await asyncio.sleep(0.02)
            running = conductor.in_flight
            task.cancel()  # the client gives up and closes its connection
            for _ in range(40):  # 2 s: well before the images would be done
                if not conductor.in_flight:
                    break
                await asyncio.sleep(0.05)
            return running, conductor.in_flight

    running, left = run(main())
    assert running == 2 and left == 0
