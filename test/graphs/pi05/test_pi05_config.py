"""Pi05Config from the real config.json layouts (openpi PyTorch port, LeRobot) and our presets."""

from __future__ import annotations

import json

import pytest

from mstar_graphs.common.config_loader import ConfigError
from mstar_graphs.pi05.config import VARIANTS, Pi05Config
from mstar_graphs.pi05.pi05 import Pi05Model
from mstar_graphs.pi05.tiny import PRESETS, config_dict

# What openpi's examples/convert_jax_model_to_pytorch.py writes for a pi0.5 checkpoint.
OPENPI = {
    "action_dim": 32,
    "action_horizon": 50,
    "paligemma_variant": "gemma_2b",
    "action_expert_variant": "gemma_300m",
    "precision": "bfloat16",
}
# A LeRobot pi05 policy config.json (a subset of its fields; the rest are ignored).
LEROBOT = {
    "type": "pi05",
    "n_obs_steps": 1,
    "chunk_size": 50,
    "n_action_steps": 50,
    "max_state_dim": 32,
    "max_action_dim": 32,
    "num_inference_steps": 10,
    "paligemma_variant": "gemma_2b",
    "action_expert_variant": "gemma_300m",
    "dtype": "bfloat16",
    "image_resolution": [224, 224],
    "tokenizer_max_length": 200,
    "min_period": 0.004,
    "max_period": 4.0,
    "time_sampling_beta_alpha": 1.5,
    "normalization_mapping": {"ACTION": "MEAN_STD"},
    "input_features": {},
    "device": "cuda",
}


def test_openpi_layout_is_the_released_model():
    cfg = Pi05Config.from_dict(OPENPI)
    assert (cfg.prefix, cfg.expert) == (VARIANTS["gemma_2b"], VARIANTS["gemma_300m"])
    v = cfg.vision
    assert (v.image_size, v.patch_size, v.width, v.depth, v.heads, v.mlp_dim, v.num_patches) == (
        224,
        14,
        1152,
        27,
        16,
        4304,
        256,
    )
    assert (cfg.action_horizon, cfg.action_dim, cfg.num_steps, cfg.max_token_len) == (50, 32, 10, 200)
    assert (cfg.vocab_size, cfg.dtype, cfg.discrete_state_input, cfg.random_weights) == (
        257152,
        "bfloat16",
        True,
        False,
    )
    model = Pi05Model(cfg, device="meta")  # the real sizes build (on meta: no memory)
    spec = model.kv_spec()
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (18, 1, 256)
    n = sum(p.numel() for p in model.parameters())
    assert 2.9e9 < n < 3.1e9  # Gemma 2B (with its 257k x 2048 embedding) + 300M expert


def test_lerobot_layout():
    cfg = Pi05Config.from_dict(LEROBOT)
    assert (cfg.action_horizon, cfg.action_dim, cfg.max_token_len) == (50, 32, 200)
    assert cfg.prefix == VARIANTS["gemma_2b"] and cfg.dtype == "bfloat16"


def test_a_full_openpi_config_can_keep_the_state_out_of_the_prompt():
    """openpi's pi05_libero trains with discrete_state_input=False: no state text in its prompt."""
    assert Pi05Config.from_dict({**OPENPI, "discrete_state_input": False}).discrete_state_input is False
    assert Pi05Config.from_dict(OPENPI).discrete_state_input is True


def test_from_dir_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**OPENPI, "action_horizon": 15}))
    assert Pi05Config.from_dir(tmp_path).action_horizon == 15
    with pytest.raises(ConfigError, match="no such file"):
        Pi05Config.from_dir(tmp_path / "nowhere")


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_are_valid_and_random(preset):
    cfg = Pi05Config.from_dict(config_dict(preset))
    assert cfg.random_weights
    assert cfg.expert.depth == cfg.prefix.depth and cfg.expert.head_dim == cfg.prefix.head_dim
    assert cfg.vision.image_size == 224 and cfg.vision.num_patches == 256


@pytest.mark.parametrize(
    "change, field",
    [
        ({"paligemma_variant": "gemma_7b"}, "paligemma_variant"),
        ({"action_dim": "32"}, "action_dim"),
        ({"action_horizon": 0}, "action_horizon"),
        ({"precision": "int8"}, "precision"),
        ({"type": "pi0"}, "type"),
        ({"pi05": False}, "pi05"),
        ({"image_resolution": [224, 256]}, "image_resolution"),
        ({"image_resolution": [225, 225]}, "vision.patch_size"),
        (
            {
                "mstar_dims": {
                    "action_expert": {
                        "width": 1024,
                        "depth": 12,
                        "mlp_dim": 4096,
                        "num_heads": 8,
                        "num_kv_heads": 1,
                        "head_dim": 256,
                    }
                }
            },
            "action_expert.depth",
        ),
        ({"mstar_dims": {"action_expert": {"width": 1024}}}, "mstar_dims.action_expert"),
        ({"mstar_dims": {"vocab_size": -3}}, "vocab_size"),
        ({"mstar_dims": {"colour": 3}}, "mstar_dims"),
    ],
)
def test_errors_name_the_field(change, field):
    with pytest.raises(ConfigError) as info:
        Pi05Config.from_dict({**OPENPI, **change}, source="ckpt/config.json")
    assert str(info.value).startswith("ckpt/config.json: ") and field in str(info.value), str(info.value)


def test_not_json_is_an_error():
    with pytest.raises(ConfigError, match="not valid JSON"):
        Pi05Config.from_json(b"{nope")
