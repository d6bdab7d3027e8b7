"""Orpheus across Worker processes: LLM and SNAC apart (each transport), prefill and decode apart."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor
from mstar.sampling_params import SamplingParams
from mstar_graphs.orpheus.components import orpheus_spec
from mstar_graphs.orpheus.frontend import OrpheusTTS
from support.parity import FP32

GREEDY = SamplingParams(max_tokens=64, seed=7)
TEXTS = ["Hello there.", "The quick brown fox jumps over the lazy dog, twice.", "Robots and voices"]

SPLIT = """world_size: 2
node_groups:
  - {nodes: [llm], ranks: [0]}
  - {nodes: [snac], ranks: [1]}
transport: {default: %s}
"""
PD = """world_size: 2
node_groups:
  - {nodes: [llm], ranks: [0], walks: [prefill]}
  - {nodes: [llm], ranks: [1], walks: [decode]}
  - {nodes: [snac], ranks: [1]}
"""


@pytest.fixture(scope="module")
def tts() -> OrpheusTTS:
    return OrpheusTTS.load(progress=False)


async def _serve(tts: OrpheusTTS, conductor: Conductor, outputs=None):
    async with conductor:
        streams = [
            conductor.submit(tts.request(t, sampling=GREEDY, request_id=f"t{i}", outputs=outputs))
            for i, t in enumerate(TEXTS)
        ]
        results = await asyncio.gather(*(s.collect() for s in streams))
        await conductor.wait_idle(timeout=10)
    return results


@pytest.fixture(scope="module")
def single_process(tts):
    return asyncio.run(_serve(tts, Conductor(tts.graph(), tts.modules(), config=FP32)))


def _same_audio(got, expected) -> None:
    for g, e in zip(got, expected):
        assert len(g["audio"]) == len(e["audio"]) > 0
        ours, ref = torch.cat(g["audio"]), torch.cat(e["audio"])
        assert torch.allclose(ours, ref, atol=1e-5, rtol=0), float((ours - ref).abs().max())


@pytest.mark.parametrize("transport", ["shm", "tcp", "mooncake"])
def test_llm_and_snac_in_two_processes_stream_the_same_audio(tts, single_process, tmp_path, transport):
    path = tmp_path / "split.yaml"
    path.write_text(SPLIT % transport)
    conductor = Conductor.distributed(orpheus_spec(), path, config=FP32)
    got = asyncio.run(_serve(tts, conductor, outputs=frozenset({"audio"})))
    assert conductor.router.exports("llm", 0, frozenset({"audio"})) == {"token": transport}
    _same_audio(got, single_process)


def test_prefill_and_decode_on_two_ranks_give_the_same_tokens(tts, single_process, tmp_path):
    path = tmp_path / "pd.yaml"
    path.write_text(PD)
    got = asyncio.run(_serve(tts, Conductor.distributed(orpheus_spec(), path, config=FP32)))
    for g, e in zip(got, single_process):
        assert [int(t) for t in g["tokens"]] == [int(t) for t in e["tokens"]]
    _same_audio(got, single_process)


def test_tensor_parallel_llm_over_two_processes_gives_the_same_tokens(tts, single_process):
    from pathlib import Path

    path = Path(__file__).parents[3] / "config" / "placement" / "orpheus-tp2.yaml"
    conductor = Conductor.distributed(orpheus_spec(), path, config=FP32)
    got = asyncio.run(_serve(tts, conductor))
    for g, e in zip(got, single_process):
        assert [int(t) for t in g["tokens"]] == [int(t) for t in e["tokens"]]
    _same_audio(got, single_process)
    assert all(p.poll() is not None for p in conductor.pool._processes.values())


@pytest.mark.slow
def test_killing_a_tensor_parallel_rank_fails_fast_and_restarts_the_group(tts):
    import os
    import time
    from pathlib import Path

    from mstar.conductor import RequestError

    path = Path(__file__).parents[3] / "config" / "placement" / "orpheus-tp2.yaml"

    async def go():
        conductor = Conductor.distributed(orpheus_spec(), path, config=FP32)
        async with conductor:
            old = {r: w.pid for r, w in conductor.pool.workers.items()}
            stream = conductor.submit(
                tts.request(
                    TEXTS[1],
                    sampling=SamplingParams(max_tokens=600, seed=1),
                    request_id="doomed",
                    outputs=frozenset({"tokens"}),
                )
            )
            await stream.__anext__()
            os.kill(old[1], 9)
            killed = time.monotonic()
            with pytest.raises(RequestError) as info:
                async for _ in stream:
                    pass
            noticed = time.monotonic() - killed
            after = await conductor.submit(tts.request(TEXTS[0], sampling=GREEDY, request_id="next")).collect()
            new = {r: w.pid for r, w in conductor.pool.workers.items()}
        return str(info.value), noticed, after, old, new

    error, noticed, after, old, new = asyncio.run(go())
    assert noticed < 1.0, noticed
    assert "worker rank" in error or "tensor-parallel step failed" in error, error
    assert len(after["tokens"]) > 0
    assert new[0] != old[0] and new[1] != old[1]  # the whole group was restarted
