"""Images into Qwen3-Omni: the vision encoder (with its deepstack rows), the Thinker's M-RoPE positions and
deepstack adds, and the Talker's positions, against transformers' ``generate`` on real images through our
image preprocessor; batched beside text and audio; bad images refused."""

from __future__ import annotations

import asyncio

import numpy as np
import PIL.Image
import pytest
import torch

from mstar.conductor import Conductor
from mstar.request import RequestError
from mstar.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.audio_encoder import tokens_for_frames
from mstar_graphs.qwen3_omni.audio_features import log_mel
from mstar_graphs.qwen3_omni.chat import Turn, prompt_ids
from mstar_graphs.qwen3_omni.direct import chunked_decode
from mstar_graphs.qwen3_omni.frontend import Qwen3OmniChat
from mstar_graphs.qwen3_omni.image_processor import ImagePreprocessor, image_pad_count
from mstar_graphs.qwen3_omni.reference import reference_generate
from support.images import bomb_png, picture
from support.parity import FP32, fp32
from support.qwen3_omni_prompts import TEXT_PROMPT, audio_prompt

GREEDY_TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05)


@pytest.fixture(scope="module")
def chat(q3_ckpt) -> Qwen3OmniChat:
    return Qwen3OmniChat.load(q3_ckpt, progress=False, first_chunk=None)


@pytest.fixture(scope="module")
def two_images(chat):
    return [chat.images(picture(70, 50, 1)), chat.images(picture(40, 90, 2))]


def image_prompt(chat, images) -> list[int]:
    pads = tuple(image_pad_count(grid) for _, grid in images)
    return prompt_ids(chat.tokenizer, chat.model.config, [Turn("user", "what is in these pictures", 0, pads)])


def test_the_vision_encoder_matches_the_reference(q3_ckpt, q3_ref):
    from mstar_graphs.qwen3_omni.checkpoints import load_component

    ours = load_component("vision_encoder", q3_ckpt, progress=False)
    grids = [(1, 4, 6), (1, 10, 8), (2, 2, 2)]
    pixels = torch.randn(
        sum(t * h * w for t, h, w in grids), 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        ref = q3_ref.thinker.model.visual(pixels, grid_thw=torch.tensor(grids), return_dict=True)
        got = ours.encode(pixels, grids)
    expected = [ref.pooler_output, *ref.deepstack_features]
    assert len(expected) == 3 and got.shape == (sum(t * h * w for t, h, w in grids) // 4, 3 * 32)
    for part, want in zip(got.split(32, dim=1), expected):
        assert (part - want).abs().max() / want.abs().max() < 1e-5


def test_an_image_prompt_served_gives_what_the_reference_generates(chat, q3_ref, two_images):
    """Two real images (resized and patched by our preprocessor) in one turn: the Thinker's text and the
    Talker's codes equal transformers' generate(return_audio=True), greedy; the audio equals Code2Wav's
    chunked decode of those codes."""
    model = chat.model
    prompt = image_prompt(chat, two_images)
    ref = reference_generate(q3_ref, prompt, images=two_images, thinker_max_new_tokens=6, talker_max_new_tokens=14)

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            return await c.submit(
                model.request(
                    prompt, images=two_images, thinker_max_tokens=6, talker_max_tokens=14, talker_sampling=GREEDY_TALKER
                )
            ).collect()

    out = asyncio.run(main())
    assert [int(t) for t in out["text_ids"]] == ref.text_ids and len(ref.text_ids) == 6
    codes = torch.stack(out["codes"]).T
    assert torch.equal(codes, ref.codes) and codes.shape[1] >= 10
    with torch.inference_mode():
        want = chunked_decode(model.code2wav, codes, 300, 25)
    audio = torch.cat(out["audio"])
    assert audio.shape == want.shape and (audio - want).abs().max() / want.abs().max() < 1e-4


def test_an_image_prompt_split_over_steps_and_preempted_gives_what_the_reference_generates(chat, q3_ref, two_images):
    """A token budget of 7 cuts the image prompt into chunks that end inside its given positions, and a
    pool of 24 blocks of 4 preempts and recomputes sequences: the same text and codes."""

    model = chat.model
    prompt = image_prompt(chat, two_images)
    ref = reference_generate(q3_ref, prompt, images=two_images, thinker_max_new_tokens=6, talker_max_new_tokens=10)

    async def main():
        config = fp32(max_batched_tokens=7, num_kv_blocks=24, block_size=4)
        async with Conductor(model.graph(), model.modules(), config=config) as c:
            return await asyncio.gather(
                *(
                    c.submit(
                        model.request(
                            prompt,
                            images=two_images,
                            thinker_max_tokens=6,
                            talker_max_tokens=10,
                            talker_sampling=GREEDY_TALKER,
                        )
                    ).collect()
                    for _ in range(2)
                )
            )

    for out in asyncio.run(main()):
        assert [int(t) for t in out["text_ids"]] == ref.text_ids
        assert torch.equal(torch.stack(out["codes"]).T, ref.codes)


def test_images_and_audio_in_one_turn_give_the_reference_thinkers_text(chat, q3_ref, two_images):
    """A turn that shows two images and speaks a clip: both encoders' rows in prompt order (media_prompt),
    M-RoPE positions over images and audio. The reference's generate fails on such a prompt (its Talker's
    get_rope_index reads an audio_config its config lacks); its Thinker's generate gives the text ours does,
    and ours speaks it."""
    model = chat.model
    features = log_mel(0.3 * torch.sin(2 * torch.pi * 250 * torch.arange(12000) / 16000))
    pads = tuple(image_pad_count(grid) for _, grid in two_images)
    prompt = prompt_ids(
        chat.tokenizer,
        model.config,
        [Turn("user", "what do you see and hear", tokens_for_frames(features.shape[1]), pads)],
    )
    with pytest.raises(AttributeError, match="audio_config"):
        reference_generate(
            q3_ref,
            prompt,
            input_features=features,
            images=two_images,
            thinker_max_new_tokens=6,
            talker_max_new_tokens=12,
        )
    with torch.inference_mode():
        ref = q3_ref.thinker.generate(
            input_ids=torch.tensor([prompt]),
            input_features=features[None],
            feature_attention_mask=torch.ones(1, features.shape[1], dtype=torch.long),
            pixel_values=torch.cat([v for v, _ in two_images]),
            image_grid_thw=torch.tensor([list(g) for _, g in two_images]),
            max_new_tokens=6,
            do_sample=False,
        )[0, len(prompt) :].tolist()

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            return await c.submit(
                model.request(
                    prompt,
                    features=features,
                    images=two_images,
                    thinker_max_tokens=6,
                    talker_max_tokens=12,
                    talker_sampling=GREEDY_TALKER,
                )
            ).collect()

    out = asyncio.run(main())
    assert [int(t) for t in out["text_ids"]] == ref and len(ref) == 6
    assert len(out["codes"]) >= 10 and out["audio"]


def test_an_image_request_batched_beside_text_and_audio_gets_what_it_gets_alone(chat, two_images):
    model = chat.model
    features = log_mel(0.3 * torch.sin(2 * torch.pi * 300 * torch.arange(16000) / 16000))
    prompts = [
        dict(prompt_ids=image_prompt(chat, two_images[:1]), images=two_images[:1]),
        dict(prompt_ids=TEXT_PROMPT),
        dict(prompt_ids=audio_prompt(tokens_for_frames(features.shape[1])), features=features),
        dict(prompt_ids=image_prompt(chat, two_images), images=two_images),
    ]

    def request(i: int):
        p = dict(prompts[i])
        return model.request(
            p.pop("prompt_ids"), **p, thinker_max_tokens=5, talker_max_tokens=12, talker_sampling=GREEDY_TALKER
        )

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            idle = c.kv_blocks_used()
            alone = [await c.submit(request(i)).collect() for i in range(len(prompts))]
            together = await asyncio.gather(*(c.submit(request(i)).collect() for i in range(len(prompts))))
            await c.wait_idle(timeout=10)
            return alone, together, idle, c.kv_blocks_used()

    alone, together, idle, used = asyncio.run(main())
    for a, b in zip(alone, together):
        assert [int(t) for t in a["text_ids"]] == [int(t) for t in b["text_ids"]]
        assert torch.equal(torch.stack(a["codes"]), torch.stack(b["codes"]))
    assert alone[0]["text_ids"] != alone[1]["text_ids"]  # the image changed the answer
    assert used == idle


def test_a_turn_with_an_image_through_the_chat_api(chat):
    """Qwen3OmniChat.request(images=...) lays the image out in the prompt and gives the model its patches."""
    request = chat.request("what is this", images=[picture(64, 64, 3)])
    pads = int((request.inputs["prompt_ids"] == chat.model.config.thinker_config.image_token_id).sum())
    assert pads == 4 and request.inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert request.inputs["pixel_values"].shape == (16, 3 * 2 * 16 * 16)


def test_bad_images_get_clear_errors_and_the_others_are_served(chat, two_images, tmp_path):
    import io

    model = chat.model
    huge = PIL.Image.open(io.BytesIO(bomb_png(9_000, 8_000)))  # 72 MP declared, nothing decoded yet
    with pytest.raises(ValueError, match=r"image is 9000 x 8000 = 72000000 pixels, over the limit of 67108864"):
        chat.images(huge)
    with pytest.raises(ValueError, match="aspect ratio"):
        chat.images(np.zeros((4, 1000, 3), dtype=np.uint8))
    prompt = image_prompt(chat, two_images)
    with pytest.raises(ValueError, match="no image came with it"):
        model.request(prompt)
    with pytest.raises(ValueError, match="image"):
        model.request(prompt, images=two_images[:1])  # two images' pads, one image
    from mstar_graphs.qwen3_omni.audio_stream import turn_stream

    pads = tuple(image_pad_count(grid) for _, grid in two_images)
    both = prompt_ids(chat.tokenizer, model.config, [Turn("user", "and this", 1, pads)])
    assert "pixel_values" in model.request(both, images=two_images, pcm=turn_stream()).inputs
    with pytest.raises(ValueError, match="image"):  # a streamed turn's images are checked as any others
        model.request(both, images=two_images[:1], pcm=turn_stream())
    with pytest.raises(ValueError, match="do not fit its grid"):
        model.request(prompt, images=[(two_images[0][0][:-1], two_images[0][1]), two_images[1]])
    assert ImagePreprocessor().max_input_pixels == 8192 * 8192
    with pytest.raises(ValueError, match=r"the images make 12544 image tokens, over the 8128"):
        chat.request("look", images=[np.zeros((4000, 4000, 3), dtype=np.uint8)])  # counted before any resize
    with pytest.raises(ValueError, match="images are taken in user turns only"):
        chat.request("and now", history=[("assistant", "look at this", None, [picture(64, 64, 0)])])

    nan = [(torch.full_like(v, float("nan")), g) for v, g in two_images]

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            ok = model.request(TEXT_PROMPT, thinker_max_tokens=4, talker_max_tokens=6, talker_sampling=GREEDY_TALKER)
            alone = await c.submit(ok).collect()
            bad = model.request(prompt, images=nan, thinker_max_tokens=4, talker_max_tokens=6)
            ok = model.request(TEXT_PROMPT, thinker_max_tokens=4, talker_max_tokens=6, talker_sampling=GREEDY_TALKER)
            return alone, await asyncio.gather(c.submit(bad).collect(), c.submit(ok).collect(), return_exceptions=True)

    alone, (bad, ok) = asyncio.run(main())
    assert isinstance(bad, RequestError) and "NaN or infinite" in str(bad)
    assert [int(t) for t in ok["text_ids"]] == [int(t) for t in alone["text_ids"]]
