"""Qwen3-Omni config.json: real field names read, impossible shapes refused with the field's path."""
from __future__ import annotations

import json

import pytest

from mstar_graphs.qwen3_omni.checkpoints import tiny_config
from mstar_graphs.qwen3_omni.config import ConfigError, Qwen3OmniConfig


def test_the_tiny_config_reads_with_the_real_token_ids():
    cfg = Qwen3OmniConfig.from_json(json.dumps(tiny_config()))
    assert cfg.thinker_config.audio_token_id == 151675 and cfg.talker_config.codec_eos_token_id == 2150
    assert cfg.thinker_config.text_config.is_moe_layer(0) and cfg.code2wav_config.samples_per_frame == 1920
    assert cfg.mstar_random_weights


@pytest.mark.parametrize("path, value, message", [
    (("thinker_config", "text_config", "num_experts_per_tok"), 9,
     "thinker_config.text_config.num_experts_per_tok: must be in [1, num_experts=4]"),
    (("talker_config", "text_config", "rope_parameters", "mrope_section"), [4, 4, 4],
     "talker_config.text_config.rope_parameters.mrope_section: [4, 4, 4] must sum to head_dim / 2 = 8"),
    (("talker_config", "text_config", "shared_expert_intermediate_size"), 0,
     "talker_config.text_config.shared_expert_intermediate_size"),
    (("talker_config", "accept_hidden_layer"), 7, "talker_config.accept_hidden_layer: must be in [0, 3]"),
    (("talker_config", "num_code_groups"), 8, "talker_config.num_code_groups: 8 codebooks per frame"),
    (("thinker_config", "text_config", "hidden_size"), "wide", "Expected `int`, got `str` - at `$.thinker_config.text_config.hidden_size`"),
])
def test_a_bad_field_is_named(path, value, message):
    cfg = tiny_config()
    node = cfg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ConfigError, match=None) as err:
        Qwen3OmniConfig.from_json(json.dumps(cfg))
    assert message in str(err.value)


def test_a_missing_config_says_what_it_expected(tmp_path):
    with pytest.raises(ConfigError, match="expected a Qwen3-Omni checkpoint directory with config.json"):
        Qwen3OmniConfig.from_dir(tmp_path)
