"""``mstar-ros serve voice --placement``: the model's nodes in Worker processes, the gateway in its own.
Orpheus whole in one Worker speaks what the in-process gateway speaks for the same request and seed;
Qwen3-Omni on two ranks answers an aiortc peer's typed turn in voice."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aiohttp import ClientSession

from mstar_ros.webrtc.client import GatewayClient
from support.webrtc_gateway import gateway_for

PLACEMENTS = Path(__file__).parents[3] / "config" / "placement"
TEXT, SEED = "Worker processes speak it.", 11


@contextlib.contextmanager
def serving(*args: str):
    """``mstar-ros serve voice ARGS --port 0`` running: its URL; stopped at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mstar_ros.cli", "serve", "voice", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen = []
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            found = re.search(r"POST (http://127\.0\.0\.1:\d+)/offer", line)
            if found:
                assert "in Worker processes per" in line, line
                yield found.group(1)
                break
        else:
            raise AssertionError(f"serve voice exited {proc.wait()}: {''.join(seen)[-3000:]}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def speech_pcm(url: str) -> bytes:
    async with ClientSession() as http:
        async with http.post(
            f"{url}/v1/audio/speech", json={"input": TEXT, "response_format": "pcm", "seed": SEED, "max_tokens": 140}
        ) as r:
            assert r.status == 200, await r.text()
            return await r.read()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_orpheus_in_one_worker_speaks_what_the_in_process_gateway_speaks(orpheus):
    async def in_process():
        async with gateway_for(orpheus) as (_, _, url):
            return await speech_pcm(url)

    reference = asyncio.run(in_process())
    with serving("--placement", str(PLACEMENTS / "orpheus-one-worker.yaml")) as url:
        apart = asyncio.run(speech_pcm(url))
    x, y = np.frombuffer(apart, np.int16).astype(int), np.frombuffer(reference, np.int16).astype(int)
    assert len(x) == len(y) > 24_000 // 2
    diff = np.abs(x - y)  # two processes' float sums may round a half differently (see test_gateway)
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_qwen3_omni_on_two_ranks_answers_a_typed_turn_in_voice():
    async def talk(url: str):
        client = GatewayClient()
        try:
            async with ClientSession() as http:
                await client.connect(http, url)
            client.send(type="session.update", session={"max_output_tokens": 40, "seed": 2})
            client.send(type="response.create", text="hello there, how are you today")
            await client.until(lambda: "response.done" in client.types(), 240, "the answer")
            return client.events, client.loud_frames()
        finally:
            await client.close()

    with serving("--model", "qwen3-omni", "--placement", str(PLACEMENTS / "qwen3-omni-two-ranks.yaml")) as url:
        events, heard = asyncio.run(talk(url))
    done = [e for e in events if e["type"] == "response.done"]
    assert [d["response"]["status"] for d in done] == ["completed"], [e["type"] for e in events]
    transcript = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert len(transcript) == 1 and transcript[0]
    assert heard > 10


@pytest.mark.parametrize("name", ["orpheus", "qwen3-omni"])
def test_the_gateway_of_a_placement_reads_no_weights_and_builds_the_same_requests(name):
    """serve voice --placement loads the model requests_only: shapes on the meta device, no weights read
    (a 30B checkpoint is not held twice); its requests are those of the loaded model."""
    import torch

    from mstar_ros.webrtc.speech_models import load_speech_model

    light = load_speech_model(name, requests_only=True, progress=False)
    full = load_speech_model(name, progress=False)
    params = [p for part in vars(light).values() if isinstance(part, torch.nn.Module) for p in part.parameters()]
    params += [
        p
        for part in vars(getattr(light, "model", light)).values()
        if isinstance(part, torch.nn.Module)
        for p in part.parameters()
    ]
    assert params and all(p.is_meta for p in params)
    with pytest.raises(RuntimeError, match="requests_only"):
        light.modules()
    a, b = light.request("hello there"), full.request("hello there")
    assert a.inputs.keys() == b.inputs.keys() and a.meta.keys() == b.meta.keys()
    assert all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
    assert light.worker_spec() == full.worker_spec()
