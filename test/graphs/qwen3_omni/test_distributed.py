"""Qwen3-Omni across Worker processes, as the paper disaggregates it: the Thinker on rank 0, the Talker
and Code2Wav on rank 1 (config/placement/qwen3-omni-two-ranks.yaml); the Thinker's rows cross processes
over shared memory; a spoken turn streams into rank 0 as it is said. Same text, codes and audio as in
one process."""
from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import torch

from mstar.conductor import Conductor
from mstar.engine.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.components import qwen3_omni_spec
from mstar_graphs.qwen3_omni.model import Qwen3Omni
from mstar_graphs.qwen3_omni.speech import Qwen3OmniChat
from support.qwen3_omni_prompts import TEXT_PROMPT

PLACEMENT = Path(__file__).parents[3] / "config" / "placement" / "qwen3-omni-two-ranks.yaml"
GREEDY_TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05)


def test_thinker_and_talker_on_two_ranks_give_what_one_process_gives(q3_ckpt):
    model = Qwen3Omni.load(q3_ckpt, progress=False)
    prompts = [TEXT_PROMPT, TEXT_PROMPT[:4] + TEXT_PROMPT[5:]]

    chat = Qwen3OmniChat(model)
    t = torch.arange(11_000) / 16000
    clip = 0.3 * torch.sin(2 * torch.pi * 220 * t) * (1 + torch.sin(2 * torch.pi * 3 * t))

    async def serve(conductor):
        async with conductor:
            streams = [conductor.submit(model.request(p, thinker_max_tokens=6, talker_max_tokens=30 + 10 * i,
                                                      talker_sampling=GREEDY_TALKER, request_id=f"q{i}"))
                       for i, p in enumerate(prompts)]
            # a spoken turn streamed in: its frames are computed on rank 0 as its samples come
            turn, samples = chat.listen_request(sampling=msgspec.structs.replace(GREEDY_TALKER, max_tokens=25),
                                                request_id="spoken")
            streams.append(conductor.submit(turn))
            for piece in clip.split(1234):
                samples.push(piece)
                await asyncio.sleep(0.005)
            samples.close()
            out = await asyncio.gather(*(s.collect() for s in streams))
            await conductor.wait_idle(timeout=10)
            return out

    alone = asyncio.run(serve(Conductor(model.graph(), model.modules())))
    apart = asyncio.run(serve(Conductor.distributed(qwen3_omni_spec(q3_ckpt), PLACEMENT)))
    assert len(apart) == len(alone) == 3 and alone[2]["audio"]
    for a, b in zip(apart, alone):
        assert [int(t) for t in a["text_ids"]] == [int(t) for t in b["text_ids"]]
        assert torch.equal(torch.stack(a["codes"]), torch.stack(b["codes"]))
        ours, ref = torch.cat(a["audio"]), torch.cat(b["audio"])
        assert ours.shape == ref.shape and (ours - ref).abs().max() / ref.abs().max() < 1e-4
