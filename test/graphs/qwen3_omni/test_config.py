"""Qwen3-Omni config.json: real field names read, impossible shapes refused with the field's path."""

from __future__ import annotations

import json

import pytest

from mstar_graphs.common.config_loader import ConfigError
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
from mstar_graphs.qwen3_omni.tiny import tiny_config


def test_the_tiny_config_reads_with_the_real_token_ids():
    cfg = Qwen3OmniConfig.from_json(json.dumps(tiny_config()))
    assert cfg.thinker_config.audio_token_id == 151675 and cfg.talker_config.codec_eos_token_id == 2150
    assert cfg.thinker_config.text_config.is_moe_layer(0) and cfg.code2wav_config.samples_per_frame == 1920
    assert cfg.mstar_random_weights


@pytest.mark.parametrize(
    "path, value, message",
    [
        (
            ("thinker_config", "text_config", "num_experts_per_tok"),
            9,
            "thinker_config.text_config.num_experts_per_tok: must be in [1, num_experts=4]",
        ),
        (
            ("talker_config", "text_config", "rope_parameters", "mrope_section"),
            [4, 4, 4],
            "talker_config.text_config.rope_parameters.mrope_section: [4, 4, 4] must sum to head_dim / 2 = 8",
        ),
        (
            ("talker_config", "text_config", "shared_expert_intermediate_size"),
            0,
            "talker_config.text_config.shared_expert_intermediate_size",
        ),
        (("talker_config", "accept_hidden_layer"), 7, "talker_config.accept_hidden_layer: must be in [0, 3]"),
        (("talker_config", "num_code_groups"), 8, "talker_config.num_code_groups: 8 codebooks per frame"),
        (
            ("thinker_config", "text_config", "hidden_size"),
            "wide",
            "thinker_config.text_config.hidden_size: Expected `int`, got `str`",
        ),
    ],
)
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


def _with(cfg: dict, path: tuple[str, ...], **fields) -> dict:
    node = cfg
    for key in path:
        node = node[key]
    node.update(fields)
    return cfg


def test_transformers_other_names_for_a_field_are_read():
    """transformers' attribute maps: save_pretrained writes the Talker's num_experts as num_local_experts."""
    cfg = tiny_config()
    talker_text = cfg["talker_config"]["text_config"]
    talker_text["num_local_experts"] = talker_text.pop("num_experts")
    audio = cfg["thinker_config"]["audio_config"]
    audio["hidden_size"], audio["num_hidden_layers"] = audio.pop("d_model"), audio.pop("encoder_layers")
    audio["num_attention_heads"], audio["intermediate_size"] = (
        audio.pop("encoder_attention_heads"),
        audio.pop("encoder_ffn_dim"),
    )
    vision = cfg["thinker_config"]["vision_config"]
    vision["num_attention_heads"], vision["num_hidden_layers"] = vision.pop("num_heads"), vision.pop("depth")
    read = Qwen3OmniConfig.from_json(json.dumps(cfg))
    assert read.talker_config.text_config.num_experts == 4
    a = read.thinker_config.audio_config
    assert (a.d_model, a.encoder_layers, a.encoder_attention_heads, a.encoder_ffn_dim) == (32, 2, 2, 64)
    v = read.thinker_config.vision_config
    assert (v.num_heads, v.depth) == (2, 3)


def test_one_field_under_both_names_must_agree():
    same = _with(tiny_config(), ("talker_config", "text_config"), num_local_experts=4)
    assert Qwen3OmniConfig.from_json(json.dumps(same)).talker_config.text_config.num_experts == 4
    differ = _with(tiny_config(), ("talker_config", "text_config"), num_local_experts=8)
    with pytest.raises(
        ConfigError,
        match=r"talker_config\.text_config\.num_local_experts: 8, but "
        r"talker_config\.text_config\.num_experts .* is 4",
    ):
        Qwen3OmniConfig.from_json(json.dumps(differ))


def test_no_experts_with_a_top_k_is_refused():
    cfg = tiny_config()
    del cfg["talker_config"]["text_config"]["num_experts"]  # e.g. spelled in a way we do not read
    with pytest.raises(
        ConfigError,
        match=r"talker_config\.text_config\.num_experts: 0 experts, but "
        r"num_experts_per_tok is 2",
    ):
        Qwen3OmniConfig.from_json(json.dumps(cfg))


def test_transformers_4_rope_scaling_is_read_with_its_rope_theta():
    """Files written by transformers 4 put M-RoPE under rope_scaling and rope_theta beside it."""
    cfg = tiny_config()
    for text in (cfg["thinker_config"]["text_config"], cfg["talker_config"]["text_config"]):
        rope = text.pop("rope_parameters")
        text["rope_theta"] = rope.pop("rope_theta")
        text["rope_scaling"] = {**rope, "type": rope.pop("rope_type")}
    read = Qwen3OmniConfig.from_json(json.dumps(cfg))
    for text in (read.thinker_config.text_config, read.talker_config.text_config):
        assert text.rope_parameters.mrope_section == [4, 2, 2] and text.rope_parameters.interleaved
        assert text.theta == 1_000_000.0 and text.rope_parameters.rope_type == "default"
