"""Code2Wav streamed chunk by chunk gives the audio transformers' generate gives: the reference's
``chunked_decode(codes, 300, 25)``, whatever the chunk sizes, alone, batched, and served."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request
from mstar.conductor.stream_input import StreamInput
from mstar.graph import (
    AwaitInput,
    GraphEdge,
    GraphNode,
    LeftContextChunkPolicy,
    ModelGraph,
    PartitionConnection,
    PartitionTopology,
    StreamingGraphEdge,
)
from mstar.request import RequestError
from mstar_graphs.qwen3_omni.code2wav_stream import Code2WavStream, decode_streams, stream_step
from support.parity import FP32

FRAMES = 620  # three of the reference's 300-frame segments


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def streamed(code2wav, codes: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    stream, pieces, at = Code2WavStream(), [], 0
    for n in sizes:
        (samples,), (stream,) = decode_streams(code2wav, [codes[:, at : at + n]], [stream])
        pieces.append(samples)
        at += n
    assert at == codes.shape[1] and stream.calls == len(sizes)
    return torch.cat(pieces)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize(
    "sizes",
    [
        [5] + [25] * 24 + [15],  # a voice chat's: 5, then 25s (segment edges inside chunks)
        [1, 298, 1, 1, 300, 19],
    ],
)  # chunks ending where segments do, and a whole one
def test_a_stream_in_any_chunks_gives_the_references_generate_audio(q3, q3_ref, sizes):
    code2wav, codes = q3["code2wav"], random_codes(FRAMES, 1)
    with torch.inference_mode():
        want = q3_ref.code2wav.chunked_decode(codes[None], chunk_size=300, left_context_size=25).reshape(-1)
        got = streamed(code2wav, codes, sizes)
        assert relative_error(got, want) < 1e-4
        # frames 50-75 decoded after 25 frames of context instead (vLLM-Omni's way) are another audio
        third = code2wav.decode_chunk(codes[None, :, 25:75], 25)[0, 0]
    assert float((third - want[50 * 1920 : 50 * 1920 + third.numel()]).abs().max()) > 0.1


def test_streams_at_different_points_batch_as_each_alone(q3):
    code2wav = q3["code2wav"]
    codes = [random_codes(130, seed) for seed in (2, 3, 4)]
    with torch.inference_mode():
        streams = []
        for c, before in zip(codes, (5, 30, 100)):  # K/V of 5, 30 and 71 (a full window) frames
            (_,), (s,) = stream_step(code2wav, c[None, :, :before], [Code2WavStream()])
            streams.append((s, c[:, before : before + 25]))
        batched, _ = stream_step(code2wav, torch.stack([c for _, c in streams]), [s for s, _ in streams])
        for (s, c), got in zip(streams, batched):
            (alone,), _ = stream_step(code2wav, c[None], [s])
            assert got.shape == alone.shape == (25 * 1920,)
            # batched convolutions sum in another order (1.7e-5 measured); a masking slip is ~1e-1
            assert relative_error(got, alone) < 1e-4


def served_graph() -> ModelGraph:
    """Code2Wav alone, fed frames as the Talker streams them (a 5-frame first chunk, then 25)."""
    return ModelGraph(
        name="code2wav_alone",
        nodes=[GraphNode("code2wav", ["codes"], ["audio"])],
        edges=[
            StreamingGraphEdge("input.codes", "code2wav.codes", target_partition="vocoder"),
            GraphEdge("code2wav.audio", "output.audio"),
        ],
        walks={"speak": AwaitInput("codes")},
        next_walk=lambda s: None if s.walks_done else "speak",
        topology=PartitionTopology(
            {"vocoder": ["code2wav"]}, [PartitionConnection("input", "vocoder", LeftContextChunkPolicy(25, 0, 5))]
        ),
    )


def test_served_streams_give_the_references_audio_and_are_freed(q3, q3_ref):
    code2wav = q3["code2wav"]
    codes = [random_codes(330, 5), random_codes(90, 6)]
    bad = random_codes(40, 7)
    bad[3, 30] = 4096  # not a code: that request fails at its second chunk

    async def main():
        async with Conductor(served_graph(), {"code2wav": code2wav}, config=FP32) as c:
            feeds = [StreamInput() for _ in range(3)]
            runs = [c.submit(Request(inputs={"codes": f})) for f in feeds]
            for feed, frames in zip(feeds, [*codes, bad]):  # all at once: every chunk is sent together
                for t in range(frames.shape[1]):
                    feed.put(frames[:, t])
                feed.close()
            outs = await asyncio.gather(*(r.collect() for r in runs), return_exceptions=True)
            for _ in range(500):  # the engine hears of each request's end after its caller does
                if not code2wav._streams:
                    break
                await asyncio.sleep(0.01)
            return outs, dict(code2wav._streams)

    with torch.inference_mode():
        (*good, failed), left = asyncio.run(main())
        for out, frames in zip(good, codes):
            want = q3_ref.code2wav.chunked_decode(frames[None], chunk_size=300, left_context_size=25).reshape(-1)
            assert relative_error(torch.cat(out["audio"]), want) < 1e-4
            assert len(out["audio"]) == 1 + -(-(frames.shape[1] - 5) // 25)
    assert isinstance(failed, RequestError) and "codes must be in [0, 2048)" in str(failed)
    assert left == {}  # every request's stream freed, the failed one's too


def test_a_chunk_out_of_its_streams_order_or_with_left_context_is_refused(q3):
    from mstar.graph.node import NodeCall

    code2wav = q3["code2wav"]
    frames = list(random_codes(25, 8).T)
    with pytest.raises(ValueError, match="chunk 1 came after 0 chunk"):
        code2wav.prepare_inputs([NodeCall("r", {"codes": frames}, index=1)])
    with pytest.raises(ValueError, match="without left context"):
        code2wav.prepare_inputs([NodeCall("r", {"codes": frames}, index=0, meta={"left_context": 5})])
