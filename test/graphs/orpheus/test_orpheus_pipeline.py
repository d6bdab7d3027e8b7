"""Orpheus end to end through the Conductor, against transformers generate() + the snac package."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, RequestError
from mstar.engine.config import EngineConfig
from mstar.sampling_params import SamplingParams
from mstar_graphs.orpheus.frontend import OrpheusTTS
from mstar_graphs.orpheus.reference import hf_generate, load_hf_llm, load_reference_snac, snac_windows
from support.parity import FP32, fp32

GREEDY = SamplingParams(max_tokens=64, seed=1234)
TEXTS = [
    "Hello there.",
    "The quick brown fox jumps over the lazy dog, twice.",
    "Hi",
    "One two three four five six seven",
    "Streaming speech is fun.",
    "A",
    "Robots and voices",
    "What a day it has been for everyone here today!",
]


@pytest.fixture(scope="module")
def tts() -> OrpheusTTS:
    return OrpheusTTS.load(progress=False)


async def _run(
    tts: OrpheusTTS,
    texts: list[str],
    sampling: SamplingParams,
    config: EngineConfig | None = None,
    stagger_s: float = 0.0,
):
    async with Conductor(tts.graph(), tts.modules(), config=config or FP32) as c:
        streams = []
        for t in texts:
            streams.append(c.submit(tts.request(t, sampling=sampling)))
            if stagger_s:
                await asyncio.sleep(stagger_s)
        results = await asyncio.gather(*(s.collect() for s in streams))
        await c.wait_idle()
        stats = c.stats()
    return [([int(t) for t in r.get("tokens", [])], r.get("audio", [])) for r in results], stats


def test_greedy_tokens_and_streamed_audio_match_offline_pipeline(tts):
    ((tokens, audio),) = asyncio.run(_run(tts, [TEXTS[1]], GREEDY))[0]
    prompt = tts.prompt_ids(TEXTS[1])
    expected = hf_generate(load_hf_llm(tts.paths.llm), [prompt], max_new_tokens=64, do_sample=False)[0]
    assert len(tokens) >= 28, "too few tokens to make a window"
    assert tokens == expected
    snac = load_reference_snac(tts.paths.snac)
    reference = snac_windows(snac, tokens, GREEDY.seed)
    frames = len(tokens) // 7
    # a window per frame from the 4th; 64 tokens end with one past the last frame, so the last
    # window went out before the close and comes again for its tail
    assert len(audio) == len(reference) == (frames - 4 + 1) + 1
    ours, ref = torch.cat(audio), torch.cat(reference)
    assert ours.shape == ref.shape == (frames * 2048,), "every frame is delivered, the edges included"
    assert torch.allclose(ours, ref, atol=1e-4, rtol=0), float((ours - ref).abs().max())
    # Between the edges it is the Orpheus reference decoder's own output (which drops the edges).
    inner = torch.cat(snac_windows(snac, tokens, GREEDY.seed, edges=False))
    assert torch.allclose(ours[2048 : (frames - 2) * 2048], inner, atol=1e-4, rtol=0)


def test_a_stream_of_whole_frames_ends_with_its_last_window_in_full(tts):
    whole = SamplingParams(max_tokens=63, seed=9)
    ((tokens, audio),) = asyncio.run(_run(tts, [TEXTS[3]], whole))[0]
    assert len(tokens) == 63 and len(audio) == 9 - 4 + 1, "no repeated window"
    assert audio[0].shape == (2 * 2048,) and audio[-1].shape == (3 * 2048,)
    reference = snac_windows(load_reference_snac(tts.paths.snac), tokens, whole.seed)
    assert torch.allclose(torch.cat(audio), torch.cat(reference), atol=1e-4, rtol=0)


def test_a_stream_shorter_than_a_window_is_decoded_whole(tts):
    short = SamplingParams(max_tokens=23, seed=5)  # 3 whole frames and 2 tokens of a 4th
    ((tokens, audio),) = asyncio.run(_run(tts, [TEXTS[0]], short))[0]
    assert len(tokens) == 23 and len(audio) == 1
    reference = snac_windows(load_reference_snac(tts.paths.snac), tokens, short.seed)
    assert audio[0].shape == reference[0].shape == (3 * 2048,)
    assert torch.allclose(audio[0], reference[0], atol=1e-4, rtol=0)


def test_sixteen_concurrent_requests_equal_each_alone(tts):
    texts = [TEXTS[i % len(TEXTS)] + " " * (i // len(TEXTS)) + "x" * (i % 5) for i in range(16)]
    alone = [asyncio.run(_run(tts, [t], GREEDY))[0][0] for t in texts]
    together, _ = asyncio.run(_run(tts, texts, GREEDY))
    for (tok_a, aud_a), (tok_b, aud_b) in zip(alone, together):
        assert tok_a == tok_b
        assert len(aud_a) == len(aud_b)
        assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(aud_a, aud_b))
    # Arriving one after another: each waits to start in the running ones' frame phase, answers unchanged.
    staggered, stats = asyncio.run(_run(tts, texts[:6], GREEDY, stagger_s=0.05))
    assert [t for t, _ in staggered] == [t for t, _ in alone[:6]]
    assert stats["workers"][0]["ar:llm"]["phase_waits"] > 0
    # A pool too small for all of them at once: requests wait or are preempted, answers unchanged.
    small = fp32(num_kv_blocks=24, block_size=8)
    squeezed, stats = asyncio.run(_run(tts, texts, GREEDY, small))
    assert [t for t, _ in squeezed] == [t for t, _ in alone]
    assert stats["workers"][0]["ar:llm"]["preemptions"] > 0


def test_bad_inputs_give_clear_errors_and_serving_continues(tts):
    with pytest.raises(ValueError, match="text is empty"):
        tts.request("   ")
    with pytest.raises(ValueError, match="context limit"):
        tts.request("word " * 3000, sampling=SamplingParams(max_tokens=64))

    async def scenario():
        async with Conductor(tts.graph(), tts.modules(), config=FP32) as c:
            from mstar.conductor import Request, UnknownRequest

            with pytest.raises(UnknownRequest):
                await c.cancel("no-such-request")
            bad = Request({"prompt_ids": torch.tensor([10**7])}, GREEDY)
            with pytest.raises(RequestError, match="outside the vocabulary"):
                await c.submit(bad).collect()
            good = await c.submit(tts.request(TEXTS[0], sampling=GREEDY)).collect()
            assert len(good["audio"]) > 0
            await c.wait_idle()

    asyncio.run(scenario())


def test_cancel_mid_stream_frees_everything(tts):
    async def scenario():
        async with Conductor(tts.graph(), tts.modules(), config=FP32) as c:
            keep = c.submit(tts.request(TEXTS[2], sampling=GREEDY))
            victim_req = tts.request(TEXTS[3], sampling=SamplingParams(max_tokens=400, seed=1))
            victim = c.submit(victim_req)
            first = await victim.__anext__()
            assert first.name in ("tokens", "audio")
            await c.cancel(victim_req.request_id)
            from mstar.conductor import RequestCancelled

            with pytest.raises(RequestCancelled):
                async for _ in victim:
                    pass
            assert len((await keep.collect())["audio"]) > 0
            await c.wait_idle()
            assert c.kv_blocks_used() == 0

    asyncio.run(scenario())
