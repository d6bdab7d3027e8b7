"""The released layout check, the LLM loader's name map and its reports, the cached tiny checkpoint."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from mstar.weights import WeightsError
from mstar_graphs.bagel.checkpoints import LayoutError, check_layout, is_random_weights, resolve_path
from mstar_graphs.bagel.llm import BagelLLM


@pytest.fixture
def copy(ckpt, tmp_path):
    out = tmp_path / "ckpt"
    shutil.copytree(ckpt, out)
    return out


def test_tiny_checkpoint_has_the_released_layout(ckpt):
    assert check_layout(ckpt) == ckpt
    assert is_random_weights(ckpt)
    names = load_file(str(ckpt / "ema.safetensors"))
    assert "language_model.model.layers.1.self_attn.q_norm_moe_gen.weight" in names
    assert "language_model.model.layers.0.mlp_moe_gen.gate_proj.weight" in names
    assert "language_model.model.layers.0.self_attn.o_proj.bias" not in names  # Qwen2: no o_proj bias
    assert names["llm2vae.weight"].shape == (64, 64)


def test_missing_files_are_each_named(copy):
    (copy / "ae.safetensors").unlink()
    (copy / "vit_config.json").unlink()
    with pytest.raises(LayoutError) as err:
        check_layout(copy)
    assert "missing vit_config.json, ae.safetensors" in str(err.value)
    with pytest.raises(FileNotFoundError, match="ae.safetensors"):
        BagelLLM.from_pretrained_dir(copy)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        resolve_path(copy / "nowhere")


def test_loader_names_missing_and_unexpected_tensors_by_checkpoint_name(copy):
    tensors = load_file(str(copy / "ema.safetensors"))
    del tensors["language_model.model.layers.1.mlp_moe_gen.up_proj.weight"]
    tensors["language_model.model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)
    save_file(tensors, str(copy / "ema.safetensors"))
    with pytest.raises(WeightsError) as err:
        BagelLLM.from_pretrained_dir(copy)
    message = str(err.value)
    assert "missing" in message and "    language_model.model.layers.1.mlp_moe_gen.up_proj.weight" in message
    assert "unexpected" in message and "language_model.model.layers.0.self_attn.o_proj.bias" in message


def test_other_modules_tensors_are_skipped(copy, model):
    tensors = load_file(str(copy / "ema.safetensors"))
    for name in ("vit_model.vision_model.post_layernorm.weight", "connector.fc1.bias", "vae2llm.bias"):
        tensors[name] = torch.ones(3)
    tensors["latent_pos_embed.pos_embed"] = torch.ones(16, 64)
    save_file(tensors, str(copy / "ema.safetensors"))
    loaded = BagelLLM.from_pretrained_dir(copy)
    assert torch.equal(loaded.llm2vae.weight, model.llm2vae.weight)
    assert torch.equal(
        loaded.model.layers[1].mlp_moe_gen.up_proj.weight, model.model.layers[1].mlp_moe_gen.up_proj.weight
    )


def test_resolve_none_generates_the_tiny_checkpoint_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MSTAR_CACHE", str(tmp_path / "cache"))
    path = resolve_path(None)
    assert check_layout(path) == path and is_random_weights(path)
    stamp = (path / "ema.safetensors").stat().st_mtime_ns
    assert resolve_path(None) == path and (path / "ema.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="unknown BAGEL preset"):
        resolve_path(None, preset="huge")
