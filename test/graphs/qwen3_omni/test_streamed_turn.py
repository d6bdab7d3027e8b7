"""A spoken turn streamed into the Qwen3-Omni graph while it is said (input.pcm, AwaitInput): its frames are
computed chunk by chunk as the samples come, the answer starts when the stream closes, and it is the
answer to the same clip given whole; bad streams fail their request with a message, others still run."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar.request import RequestError
from mstar.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.audio_features import log_mel
from mstar_graphs.qwen3_omni.audio_stream import turn_stream
from mstar_graphs.qwen3_omni.chat import Turn, prompt_ids
from mstar_graphs.qwen3_omni.frontend import Qwen3OmniChat
from mstar_graphs.qwen3_omni.model import Qwen3Omni
from support.images import picture
from support.parity import FP32

GREEDY_TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05, max_tokens=30)


def speechlike(seconds: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(16000 * seconds)) / 16000
    return 0.3 * torch.sin(2 * torch.pi * 220 * t) * (1 + torch.sin(2 * torch.pi * 3 * t)) + 0.01 * torch.randn(
        t.shape, generator=g
    )


@pytest.fixture(scope="module")
def chat(q3_ckpt):
    return Qwen3OmniChat.load(q3_ckpt, progress=False)


async def push_slowly(stream, samples: torch.Tensor, seed: int) -> int:
    """The samples in pieces of uneven sizes (as a microphone's resampler gives them), with pauses;
    returns how many pieces went in."""
    g = torch.Generator().manual_seed(seed)
    at = pieces = 0
    while at < samples.numel():
        size = int(torch.randint(50, 2500, (1,), generator=g))
        stream.push(samples[at : at + size])
        at += size
        pieces += 1
        await asyncio.sleep(0.002)
    stream.close()
    return pieces


def test_a_streamed_turn_is_answered_as_the_whole_clip_is(chat):
    clips = [speechlike(1.73, 1), speechlike(0.45, 2)]  # neither a whole number of 20 ms items

    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            idle = c.kv_blocks_used()
            whole = [await c.submit(chat.request(audio=clip, sampling=GREEDY_TALKER)).collect() for clip in clips]
            streamed = []
            for i, clip in enumerate(clips):
                request, stream = chat.listen_request(sampling=GREEDY_TALKER)
                outputs = c.submit(request)
                pushing = asyncio.ensure_future(push_slowly(stream, clip, i))
                result = await outputs.collect()
                await pushing
                streamed.append(result)
            # two turns streaming at once, beside a typed one
            pairs = [chat.listen_request(sampling=GREEDY_TALKER) for _ in clips]
            typed = c.submit(chat.request("hello there", sampling=GREEDY_TALKER))
            runs = [c.submit(r) for r, _ in pairs]
            pushes = [asyncio.ensure_future(push_slowly(s, clip, 7 + i)) for (_, s), clip in zip(pairs, clips)]
            together = await asyncio.gather(*(r.collect() for r in runs), typed.collect(), *pushes)
            for _ in range(200):
                if c.kv_blocks_used() == idle:
                    break
                await asyncio.sleep(0.01)
            return whole, streamed, together[:2], c.kv_blocks_used(), idle

    whole, streamed, together, used, idle = asyncio.run(main())
    for got in (streamed, together):
        for out, ref in zip(got, whole):
            assert [int(t) for t in out["text_ids"]] == [int(t) for t in ref["text_ids"]]
            assert torch.equal(torch.stack(out["codes"]), torch.stack(ref["codes"]))
    for out, ref in zip(streamed, whole):
        assert torch.equal(torch.cat(out["audio"]), torch.cat(ref["audio"]))
    # turns at once may share a code2wav batch when their calls fall due together (timing): the same codes,
    # decoded in a batch of another size, may round differently (seen: 1.6e-5 on samples of ~0.4; 1e-4 is -80 dB)
    for out, ref in zip(together, whole):
        torch.testing.assert_close(torch.cat(out["audio"]), torch.cat(ref["audio"]), rtol=1e-3, atol=1e-4)
    assert all(len(out["text_ids"]) > 1 and out["audio"] for out in whole)
    assert used == idle


def test_a_streamed_turn_with_images_is_answered_as_the_whole_clip_with_them_is(chat):
    """Images shown before the spoken turn (one in an earlier turn, one in this one) are encoded while it
    streams in; their M-RoPE positions and rows follow the widened prompt: the same answer as the clip
    given whole with the same images, alone and batched beside the same turn without images."""
    clip = speechlike(1.3, 4)
    history = [("user", "look at this", None, [picture(60, 44, 1)]), ("assistant", "a colour field")]
    shown = [picture(36, 70, 2)]

    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            idle = c.kv_blocks_used()
            whole = await c.submit(
                chat.request(audio=clip, images=shown, history=history, sampling=GREEDY_TALKER)
            ).collect()
            blind = await c.submit(chat.request(audio=clip, sampling=GREEDY_TALKER)).collect()
            request, stream = chat.listen_request(images=shown, history=history, sampling=GREEDY_TALKER)
            alone = c.submit(request)
            pushing = asyncio.ensure_future(push_slowly(stream, clip, 3))
            alone = await alone.collect()
            await pushing
            pairs = [
                chat.listen_request(images=shown, history=history, sampling=GREEDY_TALKER),
                chat.listen_request(sampling=GREEDY_TALKER),
            ]
            runs = [c.submit(r) for r, _ in pairs]
            pushes = [asyncio.ensure_future(push_slowly(s, clip, 5 + i)) for i, (_, s) in enumerate(pairs)]
            together = await asyncio.gather(*(r.collect() for r in runs), *pushes)
            for _ in range(200):
                if c.kv_blocks_used() == idle:
                    break
                await asyncio.sleep(0.01)
            return whole, blind, alone, together[:2], c.kv_blocks_used(), idle

    whole, blind, alone, (batched, batched_blind), used, idle = asyncio.run(main())
    codes = lambda out: torch.stack(out["codes"])  # noqa: E731
    assert [int(t) for t in whole["text_ids"]] != [int(t) for t in blind["text_ids"]]  # the images count
    for out, ref in ((alone, whole), (batched, whole), (batched_blind, blind)):
        assert [int(t) for t in out["text_ids"]] == [int(t) for t in ref["text_ids"]]
        assert torch.equal(codes(out), codes(ref))
    assert torch.equal(torch.cat(alone["audio"]), torch.cat(whole["audio"]))
    for out, ref in ((batched, whole), (batched_blind, blind)):  # Code2Wav batched their chunks: its convolutions
        ref = torch.cat(ref["audio"])  # sum in another order
        assert (torch.cat(out["audio"]) - ref).abs().max() / ref.abs().max() < 1e-4
    assert used == idle


def test_the_frames_are_computed_while_the_turn_goes_on(chat):
    """Before the stream closes, the graph has already run audio_frames on what came: the answer then
    waits only for the turn's last chunk."""
    clip = speechlike(1.6, 5)

    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            request, stream = chat.listen_request(sampling=GREEDY_TALKER)
            outputs = c.submit(request)
            stream.push(clip[:16000])  # 1 s: two 0.5 s chunks' worth
            state = c._states[request.request_id]
            for _ in range(500):
                frames = [s for s in state.streams.values() if s.edge.target.node == "audio_encoder"]
                if frames and len(frames[0].items) == 2:
                    break
                await asyncio.sleep(0.01)
            before_close = {k: (s.cursor, len(s.items)) for k, s in state.streams.items()}
            nothing_yet = c.kv_blocks_used()
            stream.push(clip[16000:])
            stream.close()
            out = await outputs.collect()
            return before_close, nothing_yet, out

    before_close, blocks_while_speaking, out = asyncio.run(main())
    frames = before_close["input.pcm ~> audio_frames.pcm [thinker]"]
    assert frames == (50, 50)  # both chunks of the first second ran before the turn ended
    log_mels = before_close["audio_frames.log_mel ~> audio_encoder.log_mel [thinker]"]
    assert log_mels == (0, 2)  # their frames wait for the whole turn at the encoder
    assert blocks_while_speaking == 0  # the Thinker has not started: it answers the whole turn
    assert out["text_ids"] and out["audio"]


def test_bad_streams_fail_their_request_and_leave_others_served(chat):
    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            empty, empty_stream = chat.listen_request(sampling=GREEDY_TALKER)
            nan, nan_stream = chat.listen_request(sampling=GREEDY_TALKER)
            failed, failed_stream = chat.listen_request(sampling=GREEDY_TALKER)
            good, good_stream = chat.listen_request(sampling=GREEDY_TALKER)
            runs = [c.submit(r) for r in (empty, nan, failed, good)]
            empty_stream.close()
            bad = speechlike(0.5, 3)
            bad[1000] = float("nan")
            nan_stream.push(bad)
            nan_stream.close()
            failed_stream.push(speechlike(0.3, 4))
            failed_stream.fail("the microphone went away")
            good_stream.push(speechlike(0.6, 6))
            good_stream.close()
            results = []
            for run in runs:
                try:
                    results.append(await run.collect())
                except RequestError as exc:
                    results.append(str(exc))
            return results

    empty, nan, failed, good = asyncio.run(main())
    assert "ended with nothing" in empty
    assert "NaN" in nan
    assert "the microphone went away" in failed
    assert good["text_ids"] and good["audio"]


def test_a_stream_over_the_limit_is_refused_with_a_message():
    stream = turn_stream()
    with pytest.raises(ValueError, match="over its limit"):
        stream.push(torch.zeros(stream.max_samples + 1))


def test_a_streamed_prompt_has_one_audio_slot(q3_ckpt, chat):
    model: Qwen3Omni = chat.model
    ids = prompt_ids(chat.tokenizer, model.config, [Turn("user", "", 2)])
    with pytest.raises(ValueError, match="0 audio tokens and one slot for the streamed turn; the prompt has 2"):
        model.request(ids, pcm=turn_stream())


@pytest.mark.parametrize("samples", [401, 7200, 25 * 320, 25 * 320 + 100, 49 * 320 + 100, 86 * 320 + 77])
def test_streamed_frames_are_the_whole_clips_frames(samples):
    """Items arriving one by one, chunked as the graph's policy chunks them (the shorter last item may end a
    chunk before the close), give log_mel's features of the whole clip."""
    from mstar_graphs.qwen3_omni.audio_features import floor_and_scale, log_mel, streamed_log10_mel
    from mstar_graphs.qwen3_omni.audio_stream import CHUNK_ITEMS, CONTEXT_ITEMS, ITEM_SAMPLES
    from mstar_graphs.qwen3_omni.graph import qwen3_omni_graph

    clip = speechlike(samples / 16000, samples)
    items = list(clip.split(ITEM_SAMPLES))
    policy = qwen3_omni_graph(1, 2).topology.policy("input", "thinker")
    assert (policy.chunk, policy.left_context, policy.edges) == (CHUNK_ITEMS, CONTEXT_ITEMS, True)
    chunks, cursor = [], 0
    for available in range(1, len(items) + 1):
        for chunk in policy.ready(cursor, available, False):
            chunks.append(chunk)
            cursor = chunk.end
    chunks.append(policy.final(cursor, len(items)))
    parts = []
    for c in chunks:
        got = items[c.start : c.end]
        parts.append(
            streamed_log10_mel(torch.cat(got), sum(t.numel() for t in got[: c.left_context]), c.first, c.final)
        )
    streamed, whole = floor_and_scale(torch.cat(parts, dim=1)), log_mel(clip)
    assert streamed.shape == whole.shape
    assert (streamed - whole).abs().max() < 1e-6


def test_a_spoken_turn_in_the_history_is_heard_again_as_the_reference_hears_it(chat, q3_ref):
    """A conversation: a spoken turn, its answer, then a new spoken turn. Both clips go to the encoder (each
    as alone) and the prompt holds both runs of pads: the reply's text and codes are the reference's
    (transformers, the two clips as its processor batches them); streaming the new turn changes nothing."""
    from mstar_graphs.qwen3_omni.reference import reference_generate

    first, second = speechlike(1.3, 11), speechlike(1.1, 12)  # over 1 s: the reference pads them as alone
    history = [("user", "", first), ("assistant", "hello there")]
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.05, max_tokens=12)

    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            whole = chat.request(audio=second, history=history, sampling=greedy)
            got = await c.submit(whole).collect()
            request, stream = chat.listen_request(history=history, sampling=greedy)
            run = c.submit(request)
            await push_slowly(stream, second, 3)
            return got, await run.collect(), whole

    got, streamed, whole = asyncio.run(main())
    ids = whole.inputs["prompt_ids"].tolist()
    features = [log_mel(first), log_mel(second)]
    assert whole.inputs["clip_frames"].tolist() == [f.shape[1] for f in features]
    ref = reference_generate(
        q3_ref,
        ids,
        input_features=features,
        thinker_max_new_tokens=whole.meta["thinker_max_tokens"],
        talker_max_new_tokens=12,
    )
    text = [int(t) for t in got["text_ids"]]
    assert text == ref.text_ids[: len(text)] and len(text) > 1
    assert torch.equal(torch.stack(got["codes"], dim=1), ref.codes[:, : len(got["codes"])])
    assert [int(t) for t in streamed["text_ids"]] == text
    assert torch.equal(torch.stack(streamed["codes"]), torch.stack(got["codes"]))


def test_a_streamed_turn_near_the_context_limit_gets_a_shorter_answer(chat):
    """The request sizes the reply on the prompt with the turn's one-pad slot; once the turn's pads are
    known the graph takes them off that room, so the answer is shorter instead of a context error."""
    model: Qwen3Omni = chat.model
    context = model.config.thinker_config.text_config.max_position_embeddings
    slot = prompt_ids(chat.tokenizer, model.config, [Turn("user", "hello", 1)])
    filler = chat.tokenizer.encode("hello", add_special_tokens=False).ids[0]
    ids = slot[:3] + [filler] * (context - len(slot) - 276) + slot[3:]  # 276 positions left: a 256-token reply fits
    clip = speechlike(3.0, 9)  # 39 audio tokens: then it does not
    talker = SamplingParams(temperature=0.0, repetition_penalty=1.05)
    stream = turn_stream()
    request = model.request(ids, pcm=stream, thinker_max_tokens=256, talker_max_tokens=4, talker_sampling=talker)
    assert request.meta["thinker_max_tokens"] == 256

    async def main():
        async with Conductor(chat.graph(), chat.modules(), config=FP32) as c:
            run = c.submit(request)
            await push_slowly(stream, clip, 1)
            return await run.collect()

    out = asyncio.run(main())
    widened = len(ids) - 1 + 39
    assert len(out["text_ids"]) == context - widened  # every position the context had left
    assert out["audio"]
