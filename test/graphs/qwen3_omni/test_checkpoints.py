"""Our loader on a checkpoint written by transformers' own ``save_pretrained`` (not our tiny writer):
its config spells the Talker's expert count ``num_local_experts``, its experts are stored per expert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mstar_graphs.qwen3_omni.checkpoints import load_component
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.direct import generate
from mstar_graphs.qwen3_omni.reference import load_reference, reference_generate
from mstar_graphs.qwen3_omni.tiny import tiny_config
from support.qwen3_omni_prompts import TEXT_PROMPT


@pytest.fixture(scope="module")
def saved_by_transformers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3OmniMoeForConditionalGeneration, initialised and saved by transformers."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    fields = {k: v for k, v in tiny_config().items() if not k.startswith("mstar_")}
    torch.manual_seed(0)
    model = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(**fields))
    out = tmp_path_factory.mktemp("qwen3_omni_transformers") / "ckpt"
    model.save_pretrained(out)
    return out


def test_the_talker_expert_count_transformers_writes_is_read(saved_by_transformers):
    written = json.loads((saved_by_transformers / "config.json").read_text())["talker_config"]["text_config"]
    assert written["num_local_experts"] == 4 and "num_experts" not in written  # what this test is about
    config = Qwen3OmniConfig.from_dir(saved_by_transformers)
    assert config.talker_config.text_config.num_experts == 4


def test_generate_from_the_transformers_checkpoint_matches_transformers(saved_by_transformers):
    ours = {
        name: load_component(name, saved_by_transformers, progress=False) for name in ("thinker", "talker", "code2wav")
    }
    ref = reference_generate(
        load_reference(saved_by_transformers), TEXT_PROMPT, thinker_max_new_tokens=6, talker_max_new_tokens=12
    )
    got = generate(
        ours["thinker"],
        ours["talker"],
        ours["code2wav"],
        TEXT_PROMPT,
        thinker_max_new_tokens=6,
        talker_max_new_tokens=12,
    )
    assert got.text_ids == ref.text_ids and len(got.text_ids) == 6
    assert torch.equal(got.codes, ref.codes) and got.codes.shape[1] > 1  # the Talker's experts took part
    scale = ref.audio.abs().max()  # transformers' initialisation makes a quiet waveform: compare relative to it
    assert got.audio.shape == ref.audio.shape and scale > 0
    assert (got.audio - ref.audio).abs().max() <= 1e-4 * scale


def test_the_vision_and_audio_encoders_load_from_it(saved_by_transformers):
    for name in ("audio_encoder", "vision_encoder"):
        module = load_component(name, saved_by_transformers, progress=False)
        assert not any(p.is_meta for p in module.parameters())
