"""Qwen3-Omni across Worker processes, as the paper disaggregates it: the Thinker on rank 0, the Talker
and Code2Wav on rank 1 (config/placement/qwen3-omni-two-ranks.yaml); the Thinker's rows cross processes
over shared memory; a spoken turn streams into rank 0 as it is said, alone and after an image; and the Thinker at tensor
parallelism 2 (config/placement/qwen3-omni-thinker-tp2.yaml). Same text, codes and audio as in one
process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import torch

from mstar.conductor import Conductor
from mstar.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.components import qwen3_omni_spec
from mstar_graphs.qwen3_omni.frontend import Qwen3OmniChat
from mstar_graphs.qwen3_omni.model import Qwen3Omni
from support.images import picture
from support.parity import FP32
from support.qwen3_omni_prompts import TEXT_PROMPT

GREEDY_TALKER = SamplingParams(temperature=0.0, repetition_penalty=1.05)


PLACEMENTS = Path(__file__).parents[3] / "config" / "placement"


async def _serve(model: Qwen3Omni, conductor, ranks: list | None = None) -> list[dict]:
    """Two typed turns, two spoken turns streamed in (their frames computed as their samples come; one shows an
    image: the vision encoder runs on rank 0 while it is said) and an image turn, at once.
    ``ranks`` gets the Workers' status while they serve."""
    prompts = [TEXT_PROMPT, TEXT_PROMPT[:4] + TEXT_PROMPT[5:]]
    t = torch.arange(11_000) / 16000
    clip = 0.3 * torch.sin(2 * torch.pi * 220 * t) * (1 + torch.sin(2 * torch.pi * 3 * t))
    async with conductor:
        streams = [
            conductor.submit(
                model.request(
                    p,
                    thinker_max_tokens=6,
                    talker_max_tokens=30 + 10 * i,
                    talker_sampling=GREEDY_TALKER,
                    request_id=f"q{i}",
                )
            )
            for i, p in enumerate(prompts)
        ]
        chat = Qwen3OmniChat(model)
        turn, samples = chat.listen_request(
            sampling=msgspec.structs.replace(GREEDY_TALKER, max_tokens=25), request_id="spoken"
        )
        seeing, seen_samples = chat.listen_request(
            images=[picture(40, 30, 6)],
            request_id="spoken_image",
            sampling=msgspec.structs.replace(GREEDY_TALKER, max_tokens=20),
        )
        streams += [conductor.submit(turn), conductor.submit(seeing)]
        # an image's rows are wider (its deepstack features) and its prompt has M-RoPE positions
        pixels = torch.randn(24, 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(5))
        image = [151644, 872, 198, 151652, *[151655] * 6, 151653, 100, 151645, 198, 151644, 77091, 198]
        streams.append(
            conductor.submit(
                model.request(
                    image,
                    images=[(pixels, (1, 4, 6))],
                    thinker_max_tokens=5,
                    talker_max_tokens=20,
                    talker_sampling=GREEDY_TALKER,
                    request_id="image",
                )
            )
        )
        for piece in clip.split(1234):
            samples.push(piece)
            seen_samples.push(piece)
            await asyncio.sleep(0.005)
        samples.close()
        seen_samples.close()
        out = await asyncio.gather(*(s.collect() for s in streams))
        if ranks is not None:
            ranks.extend(conductor.worker_status())
        await conductor.wait_idle(timeout=10)
        return out


@pytest.fixture(scope="module")
def in_one_process(q3_ckpt) -> tuple[Qwen3Omni, list[dict]]:
    model = Qwen3Omni.load(q3_ckpt, progress=False)
    return model, asyncio.run(_serve(model, Conductor(model.graph(), model.modules(), config=FP32)))


def _same(apart: list[dict], alone: list[dict]) -> None:
    assert len(apart) == len(alone) == 5 and all(out["audio"] for out in alone[2:])
    for a, b in zip(apart, alone):
        assert [int(t) for t in a["text_ids"]] == [int(t) for t in b["text_ids"]]
        assert torch.equal(torch.stack(a["codes"]), torch.stack(b["codes"]))
        ours, ref = torch.cat(a["audio"]), torch.cat(b["audio"])
        assert ours.shape == ref.shape and (ours - ref).abs().max() / ref.abs().max() < 1e-4


def test_thinker_and_talker_on_two_ranks_give_what_one_process_gives(q3_ckpt, in_one_process):
    model, alone = in_one_process
    placement = PLACEMENTS / "qwen3-omni-two-ranks.yaml"
    _same(asyncio.run(_serve(model, Conductor.distributed(qwen3_omni_spec(q3_ckpt), placement, config=FP32))), alone)


def test_thinker_at_tensor_parallel_2_gives_what_one_process_gives(q3_ckpt, in_one_process):
    """The Thinker sharded over ranks 0 and 1 (heads, the experts' inner width, the vocabulary), the Talker
    and Code2Wav on rank 2. The spoken turn's encoder rows and the image's rows and positions reach rank 1 in
    the step plans."""
    model, alone = in_one_process
    placement = PLACEMENTS / "qwen3-omni-thinker-tp2.yaml"
    ranks: list = []
    _same(
        asyncio.run(_serve(model, Conductor.distributed(qwen3_omni_spec(q3_ckpt), placement, config=FP32), ranks)),
        alone,
    )
    assert [(r.rank, r.up) for r in ranks] == [(0, True), (1, True), (2, True)]
    assert "thinker" in ranks[1].nodes and "talker" in ranks[2].nodes and len({r.pid for r in ranks}) == 3


def test_a_tensor_parallel_thinker_shard_halves_heads_experts_and_vocabulary(q3_ckpt):
    from mstar.parallel.group import TPGroup
    from mstar_graphs.qwen3_omni.checkpoints import load_component
    from mstar_graphs.qwen3_omni.tensor_parallel import shard_thinker

    whole = load_component("thinker", q3_ckpt, progress=False)
    shard = shard_thinker(load_component("thinker", q3_ckpt, progress=False), TPGroup(1, 2))
    text = whole.text
    assert shard.kv_spec().num_kv_heads == text.num_key_value_heads // 2
    moe, part = whole.model.layers[0].mlp, shard.model.layers[0].mlp
    inner = text.moe_intermediate_size
    assert part.gate_up.shape == (text.num_experts, inner, text.hidden_size)
    # rank 1 keeps the second half of the gate's rows and of the up projection's rows
    assert torch.equal(part.gate_up[:, : inner // 2], moe.gate_up[:, inner // 2 : inner])
    assert torch.equal(part.gate_up[:, inner // 2 :], moe.gate_up[:, inner + inner // 2 :])
    assert torch.equal(part.down, moe.down[:, :, inner // 2 :])
    assert shard.lm_head.weight.shape[0] == text.vocab_size // 2 and shard.lm_head.vocab_start == text.vocab_size // 2
    with pytest.raises(ValueError, match="place the Talker's nodes on a rank of their own"):
        from mstar_graphs.qwen3_omni.components import qwen3_omni_components

        qwen3_omni_components({"thinker", "talker"}, str(q3_ckpt), tp=TPGroup(0, 2))
