"""/v1/chat/completions for a model that answers in text and does not speak (the toy image model):
image_url parts, streamed and whole, and audio refused naming ``modalities``."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest
from aiohttp import ClientSession

from mstar_ros.webrtc.speech_models import check_served_model
from support.images import picture
from support.toy_image_model import ToyImageModel
from support.webrtc_gateway import gateway_for


def image_part(width: int, height: int) -> dict:
    buffer = io.BytesIO()
    picture(width, height, seed=0).save(buffer, format="PNG")
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()},
    }


def test_a_text_only_model_answers_about_an_image():
    message = {"role": "user", "content": [image_part(20, 10), {"type": "text", "text": "what is it?"}]}

    async def main():
        async with gateway_for(ToyImageModel(), model_name="toy-image") as (_, _, url), ClientSession() as s:
            post = f"{url}/v1/chat/completions"
            async with s.post(post, json={"messages": [message]}) as r:
                whole = r.status, await r.json()
            async with s.post(post, json={"messages": [message], "stream": True, "modalities": ["text"]}) as r:
                streamed = await r.text()
            async with s.post(post, json={"messages": [message], "modalities": ["text", "audio"]}) as r:
                audio = r.status, await r.json()
            return whole, streamed, audio

    (status, whole), streamed, (audio_status, audio) = asyncio.run(asyncio.wait_for(main(), 60))
    expected = "I see 20x10 image(s). You asked: what is it?"
    assert status == 200, whole
    assert whole["choices"][0]["message"]["content"] == expected and "audio" not in whole["choices"][0]["message"]
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == expected
    assert audio_status == 400 and audio["error"]["param"] == "modalities"


def test_the_registry_takes_a_model_that_does_not_speak_and_names_what_one_lacks():
    check_served_model(ToyImageModel(), "toy-image")  # conversational and image-making: no audio_output needed

    class NoSize:  # makes images, lacks image_size
        image_generation = True
        max_images_per_request = 1
        generate_images = graph = modules = staticmethod(lambda: None)

    class Mute:  # neither speaks, answers nor makes images
        conversational = False

    with pytest.raises(TypeError, match="image model 'b' lacks 'image_size'"):
        check_served_model(NoSize(), "b")
    with pytest.raises(TypeError, match="speech model 'b' lacks 'audio_output'"):
        check_served_model(Mute(), "b")
