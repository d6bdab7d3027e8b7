"""BagelConfig from llm_config.json: app.py's overrides, the mstar_bagel sizes, errors that name the field."""

from __future__ import annotations

import json

import pytest

from mstar_graphs.bagel.config import BagelConfig, BagelDims, LlmConfig
from mstar_graphs.common.config_loader import ConfigError

# Qwen2.5-7B-Instruct's llm_config.json fields (as a BAGEL release ships them)
RELEASED = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
    "qk_norm": False,
    "layer_module": "Qwen2DecoderLayer",
}


def test_released_config_gets_app_overrides_and_default_dims(tmp_path):
    (tmp_path / "llm_config.json").write_text(json.dumps(RELEASED))
    cfg = BagelConfig.from_dir(tmp_path)
    llm = cfg.llm
    assert (llm.hidden_size, llm.num_hidden_layers, llm.head_dim, llm.vocab_size) == (3584, 28, 128, 152064)
    assert llm.rope_theta == 1e6 and llm.rms_norm_eps == 1e-6
    # app.py forces these whatever the file says
    assert llm.qk_norm is True and llm.tie_word_embeddings is False and llm.layer_module == "Qwen2MoTDecoderLayer"
    assert cfg.dims == BagelDims()
    assert cfg.dims.vit_max_num_patch_per_side == 70 and cfg.dims.max_latent_size == 64
    assert cfg.dims.vit_transform == (980, 224, 14) and cfg.dims.vae_transform == (1024, 512, 16)
    assert cfg.dims.latent_token_dim == 64
    assert cfg.random_weights is False
    assert LlmConfig.from_dir(tmp_path) == llm


def test_tiny_config_reads_mstar_bagel_dims(config):
    assert config.random_weights is True
    assert config.llm.hidden_size == 64 and config.llm.num_key_value_heads == 2
    assert config.dims.vit_transform == (56, 28, 14) and config.dims.vae_transform == (64, 32, 16)
    assert config.dims.vit_max_num_patch_per_side == 4 and config.dims.max_latent_size == 4


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_size": "wide"}, "hidden_size"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"model_type": "llama"}, "model_type"),
        ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
        ({"mstar_bagel": {"max_latent_size": 0}}, "mstar_bagel.max_latent_size"),
        ({"mstar_bagel": {"vae_transform": [1024, 512]}}, "mstar_bagel.vae_transform"),
        ({"mstar_bagel": {"vae_transform": [2048, 512, 16]}}, "mstar_bagel.vae_transform"),
        ({"mstar_bagel": {"latent_size": 4}}, "mstar_bagel"),
        ({"mstar_bagel": {"connector_act": "relu"}}, "mstar_bagel.connector_act"),
    ],
)
def test_bad_field_is_named_with_the_file(tmp_path, change, field):
    file = tmp_path / "llm_config.json"
    file.write_text(json.dumps({**RELEASED, **change}))
    with pytest.raises(ConfigError) as err:
        BagelConfig.from_dir(tmp_path)
    message = str(err.value)
    assert str(file) in message and field in message, message


def test_missing_required_field_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="llm_config.json: no such file"):
        BagelConfig.from_dir(tmp_path)
    (tmp_path / "llm_config.json").write_text(json.dumps({k: v for k, v in RELEASED.items() if k != "vocab_size"}))
    with pytest.raises(ConfigError, match="vocab_size: missing required field"):
        BagelConfig.from_dir(tmp_path)
