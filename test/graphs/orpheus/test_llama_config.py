"""Reading HF Llama config.json files: accepted spellings and field-named errors."""

from __future__ import annotations

import json

import pytest

from mstar_graphs.common.config_loader import ConfigError
from mstar_graphs.orpheus.config import LlamaConfig
from mstar_graphs.orpheus.tiny_llm import config_dict

BASE = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
LLAMA3 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _write(tmp_path, data) -> LlamaConfig:
    (tmp_path / "config.json").write_text(json.dumps(data))
    return LlamaConfig.from_dir(tmp_path)


def test_defaults_and_unknown_fields(tmp_path):
    cfg = _write(tmp_path, {**BASE, "architectures": ["LlamaForCausalLM"], "quantization": {"x": 1}})
    assert cfg.head_dim == 16 and cfg.num_key_value_heads == 4
    assert cfg.rope_type == "default" and cfg.rope_scaling_params() is None and cfg.rope_base == 10000.0


def test_tiny_preset_config_reads(tmp_path):
    cfg = _write(tmp_path, config_dict("tiny"))
    assert (cfg.kv_heads, cfg.dim_per_head, cfg.rope_type) == (2, 16, "llama3")
    assert cfg.torch_dtype_name == "float32"


def test_llama3_rope_in_both_spellings(tmp_path):
    old = _write(tmp_path, {**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}})
    # transformers 5 folds theta into rope_parameters and may spell the type "type".
    new = LlamaConfig.from_dict({**BASE, "rope_parameters": {"type": "llama3", "rope_theta": 500000, **LLAMA3}})
    for cfg in (old, new):
        assert cfg.rope_type == "llama3" and cfg.rope_base == 500000.0
        assert cfg.rope_scaling_params() == LLAMA3
    default_v5 = LlamaConfig.from_dict({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert default_v5.rope_type == "default" and default_v5.rope_base == 1e6
    no_len = LlamaConfig.from_dict(
        {
            **BASE,
            "max_position_embeddings": 4096,
            "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4},
        }
    )
    assert no_len.rope_scaling_params()["original_max_position_embeddings"] == 4096.0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": "64"}, "config.json: hidden_size: Expected `int`, got `str`"),
        ({"hidden_size": 66}, "config.json: hidden_size: 66 is not divisible by num_attention_heads=4"),
        ({"num_hidden_layers": -2}, "config.json: num_hidden_layers: must be > 0, got -2"),
        ({"num_key_value_heads": 3}, "config.json: num_key_value_heads: 3 does not divide num_attention_heads=4"),
        ({"head_dim": 15}, "config.json: head_dim: must be a positive even number"),
        ({"rms_norm_eps": 0}, "config.json: rms_norm_eps: must be a finite number > 0"),
        ({"tie_word_embeddings": "yes"}, "config.json: tie_word_embeddings: Expected `bool`, got `str`"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4}},
            "config.json: rope_scaling.rope_type: unsupported RoPE type 'yarn'",
        ),
        (
            {"rope_scaling": {"rope_type": "llama3", **LLAMA3, "factor": "big"}},
            "config.json: rope_scaling.factor: expected a number",
        ),
        (
            {"rope_parameters": {"rope_type": "llama3", **LLAMA3, "high_freq_factor": 0.5}},
            "config.json: rope_parameters.high_freq_factor: must exceed low_freq_factor",
        ),
        ({"hidden_act": "gelu"}, "config.json: hidden_act: only 'silu' is supported"),
        ({"torch_dtype": "int8"}, "config.json: torch_dtype: expected float32, float16 or bfloat16"),
    ],
)
def test_bad_values_name_file_and_field(tmp_path, change, message):
    with pytest.raises(ConfigError) as info:
        _write(tmp_path, {**BASE, **change})
    assert str(info.value).startswith(f"{tmp_path}/{message}"), str(info.value)  # the file with its directory


def test_missing_field_and_missing_file(tmp_path):
    data = dict(BASE)
    del data["vocab_size"]
    with pytest.raises(ConfigError, match="config.json: vocab_size: missing required field"):
        _write(tmp_path, data)
    with pytest.raises(ConfigError, match="no such file"):
        LlamaConfig.from_dir(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        LlamaConfig.from_dir(tmp_path)
    assert isinstance(ConfigError("x"), ValueError)
