"""VitConfig: the file's SigLIP fields, app.py's one-layer-fewer override, errors naming file and field."""

from __future__ import annotations

import json

import pytest

from mstar_graphs.bagel.vit_config import VitConfig
from mstar_graphs.common.config_loader import ConfigError

RELEASED = {  # the values the release's vit_config.json holds (SigLIP so400m-14-980)
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 980,
    "patch_size": 14,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "model_type": "siglip_vision_model",
    "attention_dropout": 0.0,
}


def test_released_values_with_override(tmp_path):
    (tmp_path / "vit_config.json").write_text(json.dumps(RELEASED))
    cfg = VitConfig.from_dir(tmp_path)
    assert cfg.num_hidden_layers == 26  # 27 in the file, one dropped
    assert (cfg.hidden_size, cfg.head_dim, cfg.grid, cfg.patch_dim) == (1152, 72, 70, 588)
    assert cfg.intermediate_size == 4304 and cfg.layer_norm_eps == 1e-6


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_attention_heads": 5}, "num_attention_heads"),
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"num_hidden_layers": 1}, "num_hidden_layers"),
        ({"patch_size": 15}, "patch_size"),
        ({"hidden_size": "big"}, "hidden_size"),
        ({"num_channels": 4}, "num_channels"),
    ],
)
def test_bad_field_names_file_and_field(tmp_path, change, field):
    file = tmp_path / "vit_config.json"
    file.write_text(json.dumps({**RELEASED, **change}))
    with pytest.raises(ConfigError) as err:
        VitConfig.from_dir(tmp_path)
    assert str(file) in str(err.value) and field in str(err.value)


def test_missing_field_and_missing_file(tmp_path):
    file = tmp_path / "vit_config.json"
    file.write_text(json.dumps({k: v for k, v in RELEASED.items() if k != "patch_size"}))
    with pytest.raises(ConfigError, match="patch_size: missing required field"):
        VitConfig.from_dir(file)
    with pytest.raises(ConfigError, match="no such file"):
        VitConfig.from_dir(tmp_path / "elsewhere")
