"""The Qwen3-Omni graph served by the Conductor (Thinker and Talker on AR engines, the Talker's code
predictor as its Loop feedback, Code2Wav on streamed 25-frame chunks) gives what the model computes
end to end, alone and with other requests batched beside it."""

from __future__ import annotations

import asyncio

import torch

from mstar.conductor import Conductor
from mstar.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.audio_encoder import tokens_for_frames
from mstar_graphs.qwen3_omni.audio_features import log_mel
from mstar_graphs.qwen3_omni.direct import chunked_decode, generate
from mstar_graphs.qwen3_omni.model import Qwen3Omni
from support.parity import FP32
from support.qwen3_omni_prompts import TEXT_PROMPT, audio_prompt

GREEDY_TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05)  # the reference's talker_do_sample=False


def tone(seconds: float) -> torch.Tensor:
    t = torch.arange(int(16000 * seconds)) / 16000
    return 0.3 * torch.sin(2 * torch.pi * 330 * t) * (1 + torch.sin(2 * torch.pi * 2 * t))


def test_served_graph_equals_the_model_end_to_end_alone_and_batched(q3_ckpt):
    model = Qwen3Omni.load(q3_ckpt, progress=False)
    features, other = log_mel(tone(1.3)), log_mel(tone(0.6))
    # two audio prompts: one decodes while the other's prompt rows are embeddings in the same step
    prompts = [
        (TEXT_PROMPT, None, 6, 12),
        (audio_prompt(tokens_for_frames(features.shape[1])), features, 5, 40),
        (TEXT_PROMPT[:4] + TEXT_PROMPT[5:], None, 8, 30),
        (audio_prompt(tokens_for_frames(other.shape[1])), other, 9, 20),
    ]
    expected = []
    with torch.inference_mode():
        for ids, feats, think, talk in prompts:
            rows = None if feats is None else model.audio_encoder.encode([feats])[0]
            out = generate(
                model.thinker,
                model.talker,
                model.code2wav,
                ids,
                audio_rows=rows,
                thinker_max_new_tokens=think,
                talker_max_new_tokens=talk,
            )
            expected.append((out.text_ids, out.codes, chunked_decode(model.code2wav, out.codes, 300, 25)))

    def request(i: int):
        ids, feats, think, talk = prompts[i]
        return model.request(
            ids, features=feats, thinker_max_tokens=think, talker_max_tokens=talk, talker_sampling=GREEDY_TALKER
        )

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            idle = c.kv_blocks_used()
            alone = [await c.submit(request(i)).collect() for i in range(len(prompts))]
            together = await asyncio.gather(*(c.submit(request(i)).collect() for i in range(len(prompts))))
            for _ in range(200):  # the engines free a finished request's KV as its release reaches them
                if c.kv_blocks_used() == idle:
                    break
                await asyncio.sleep(0.01)
            return alone, together, c.kv_blocks_used(), idle

    alone, together, used, idle = asyncio.run(main())
    for got in (alone, together):
        for out, (text, codes, audio) in zip(got, expected):
            assert [int(t) for t in out["text_ids"]] == text
            assert torch.equal(torch.stack(out["codes"], dim=1), codes)
            # float sums of batched convolutions round differently: relative error, as the bound
            assert (torch.cat(out["audio"]) - audio).abs().max() / audio.abs().max() < 1e-4
    assert expected[1][1].shape[1] > 25  # the audio request's frames span two Code2Wav chunks
    assert used == idle  # every stage's KV freed


def test_text_to_speech_is_the_talker_alone_on_the_texts_rows(q3_ckpt):
    """say_ids: the Talker speaks given tokens; its rows are what the Thinker's would be for that reply."""
    from mstar_graphs.qwen3_omni.direct import talk
    from mstar_graphs.qwen3_omni.talker_prompt import talker_inputs

    model = Qwen3Omni.load(q3_ckpt, progress=False)
    say = [100, 200, 300, 400]
    with torch.inference_mode():
        ids = torch.tensor(TEXT_PROMPT + say)  # the Thinker never sees the reply's last token (<|im_end|>)
        rows = model.thinker.model.embed_tokens(ids)
        inputs = talker_inputs(
            model.talker,
            model.thinker.model.embed_tokens,
            model.config,
            TEXT_PROMPT,
            rows,
            torch.zeros_like(rows),
            "ethan",
        )
        codes = talk(model.talker, inputs, 20, 1.05)

    async def main():
        async with Conductor(model.graph(), model.modules(), config=FP32) as c:
            return await c.submit(
                model.request(TEXT_PROMPT, say_ids=say, talker_max_tokens=20, talker_sampling=GREEDY_TALKER)
            ).collect()

    out = asyncio.run(main())
    assert "text_ids" not in out  # the Thinker did not run
    assert torch.equal(torch.stack(out["codes"], dim=1), codes)


def test_the_talker_speaks_while_the_thinker_still_replies(q3_ckpt):
    """Walk think_and_talk: the Talker starts on the reply's first token and reads the later ones as the
    Thinker makes them (streamed to its running Loop). Its codes are the reference's (the Talker waits for
    a row it needs), equal to a Talker started once the reply is complete; its first frame comes out
    before the Thinker's last token."""
    model = Qwen3Omni.load(q3_ckpt, progress=False)
    graph = model.graph()
    walks: list[str | None] = []
    choose = graph.next_walk

    def recording(state):
        walks.append(choose(state))
        return walks[-1]

    graph.next_walk = recording
    with torch.inference_mode():
        ref = generate(
            model.thinker,
            model.talker,
            model.code2wav,
            TEXT_PROMPT,
            thinker_max_new_tokens=40,
            talker_max_new_tokens=30,
        )

    async def main():
        async with Conductor(graph, model.modules(), config=FP32) as c:
            order = []
            async for out in c.submit(
                model.request(TEXT_PROMPT, thinker_max_tokens=40, talker_max_tokens=30, talker_sampling=GREEDY_TALKER)
            ):
                order.append((out.name, out.data))
            after = await c.submit(
                model.request(
                    TEXT_PROMPT,
                    thinker_max_tokens=40,
                    talker_max_tokens=30,
                    talker_sampling=GREEDY_TALKER,
                    talker_after_reply=True,
                )
            ).collect()
            await c.wait_idle()
            return order, after

    order, after = asyncio.run(main())
    names = [n for n, _ in order]
    text = [int(d) for n, d in order if n == "text_ids"]
    codes = torch.stack([d for n, d in order if n == "codes"], dim=1)
    assert walks[:2] == ["prefill_text", "think_and_talk"] and "talk" in walks[2:]  # the second request
    assert text == ref.text_ids and len(text) > 20
    assert torch.equal(codes, ref.codes) and torch.equal(torch.stack(after["codes"], dim=1), ref.codes)
    assert names.index("codes") < len(names) - 1 - names[::-1].index("text_ids")  # a frame before the last text
