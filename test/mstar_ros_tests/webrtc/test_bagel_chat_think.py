"""``think`` on ``/v1/chat/completions`` (the tiny BAGEL, random weights, float32, the official ``openai``
client): the answer is what the naive reference (mstar_graphs.bagel.reference) decodes greedily after the
reference's understanding recipe with thinking -- the think system prompt, the image's ViT span, the
question -- split into ``reasoning_content`` and ``content`` whole and streamed; a model without a think
mode refuses the field with a 400 naming it."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import openai
import PIL.Image
import pytest
import torch
from safetensors.torch import load_file

from mstar.conductor import Conductor
from mstar_graphs.bagel import reference
from mstar_graphs.bagel.frontend import BagelModel
from mstar_graphs.bagel.think_prompts import UNDERSTAND_THINK_PROMPT
from mstar_ros.webrtc.chat_params import ChatBody, check_chat_params
from mstar_ros.webrtc.openai_errors import APIError
from mstar_ros.webrtc.reasoning_split import split_reasoning
from mstar_ros.webrtc.server import VoiceGateway
from support.parity import FP32
from support.webrtc_gateway import serve_gateway

NEW_TOKENS = 6


def _png() -> tuple[bytes, PIL.Image.Image]:
    y, x = np.mgrid[0:32, 0:40]
    image = PIL.Image.fromarray(np.stack([x * 6 % 256, y * 8 % 256, (x * y) % 256], -1).astype(np.uint8))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), image


@pytest.fixture(scope="module")
def bagel() -> BagelModel:
    return BagelModel.load(progress=False)


def _served(bagel: BagelModel, png: bytes):
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
                {"type": "text", "text": "What is in the picture?"},
            ],
        }
    ]

    async def main():
        async with Conductor(bagel.graph(), bagel.modules(), config=FP32) as conductor:
            runner, url = await serve_gateway(VoiceGateway(bagel, conductor, model_name="bagel"))
            try:
                client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
                ask = {"model": "bagel", "messages": messages, "max_tokens": NEW_TOKENS}
                thought = await client.chat.completions.create(**ask, extra_body={"think": True})
                plain = await client.chat.completions.create(**ask)
                chunks = await client.chat.completions.create(**ask, stream=True, extra_body={"think": True})
                streamed = [c async for c in chunks]
                await client.close()
                return thought, plain, streamed
            finally:
                await runner.cleanup()

    return asyncio.run(asyncio.wait_for(main(), 120))


def test_a_thinking_answer_is_the_references_after_the_think_prompt_split_into_reasoning_and_content(
    bagel, monkeypatch
):
    decode = bagel.decode_text

    def as_thought(ids):  # random weights write no tags: the first two tokens' text is made the reasoning
        return f"<think>{decode(ids[:2])}</think>{decode(ids[2:])}" if len(ids) > 2 else f"<think>{decode(ids)}"

    monkeypatch.setattr(bagel, "decode_text", as_thought)
    png, image = _png()
    thought, plain, streamed = _served(bagel, png)

    tok, requests = bagel.tokenizer, bagel.requests
    with torch.no_grad():
        rows = bagel.modules()["vit_encoder"](requests.prepare_image(image).vit[None])["embeds"][0]
    parts = [
        ("text", tok.text_turn(UNDERSTAND_THINK_PROMPT)),
        ("und_rows", rows),
        ("text", tok.text_turn("What is in the picture?")),
    ]
    state = load_file(str(bagel.path / "ema.safetensors"))
    want = reference.ref_understand(state, bagel.config.llm, tok, parts, NEW_TOKENS + 1).tokens[1:]
    reasoning, content = split_reasoning(as_thought(want))
    assert reasoning and content, (reasoning, content)

    message = thought.choices[0].message
    assert (getattr(message, "reasoning_content", None), message.content) == (reasoning, content)
    assert thought.usage.completion_tokens == len(want) + (len(want) < NEW_TOKENS)  # + <|im_end|> when it ended
    # the think prompt is in the context: the same question without it has that many fewer prompt tokens
    assert thought.usage.prompt_tokens - plain.usage.prompt_tokens == len(tok.text_turn(UNDERSTAND_THINK_PROMPT))
    assert (
        not hasattr(plain.choices[0].message, "reasoning_content") or plain.choices[0].message.reasoning_content is None
    )
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    said = {field: "".join(getattr(d, field, None) or "" for d in deltas) for field in ("reasoning_content", "content")}
    assert (said["reasoning_content"], said["content"]) == (reasoning or "", content)


def test_a_model_without_a_think_mode_refuses_the_field():
    body = ChatBody(messages=[{"role": "user", "content": "hi"}], think=True)
    with pytest.raises(APIError) as refused:
        check_chat_params(body, object())
    assert (refused.value.status, refused.value.param) == (400, "think")
    check_chat_params(ChatBody(messages=[{"role": "user", "content": "hi"}], think=False), object())
    check_chat_params(body, BagelModel)  # BAGEL has one
