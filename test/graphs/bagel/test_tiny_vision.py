"""The generated vision half: released names, every tensor used by a loader, deterministic, real sin-cos tables."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from mstar_graphs.bagel.autoencoder import FluxAutoencoder
from mstar_graphs.bagel.latent_embed import LATENT_PREFIXES, LatentEmbedder
from mstar_graphs.bagel.sincos import sincos_2d_table
from mstar_graphs.bagel.tiny_vision import vision_tensors_and_config
from mstar_graphs.bagel.vision_encoder import VISION_PREFIXES, BagelVisionEncoder
from mstar_graphs.bagel.vit_config import VitConfig
from support.bagel_vision import LATENT_GRID, LLM_HIDDEN, VIT_GRID, write_tiny_vision_dir


def _make(seed: int):
    return vision_tensors_and_config(
        "tiny",
        LLM_HIDDEN,
        torch.Generator().manual_seed(seed),
        vit_grid=VIT_GRID,
        latent_grid=LATENT_GRID,
        latent_patch=2,
    )


def test_names_shapes_and_config():
    ema, vit_json, ae = _make(0)
    assert vit_json["num_hidden_layers"] == 3 and vit_json["model_type"] == "siglip_vision_model"
    assert vit_json["hidden_act"] == "gelu_pytorch_tanh" and vit_json["image_size"] == 14 * VIT_GRID
    assert all(name.startswith(VISION_PREFIXES + LATENT_PREFIXES) for name in ema)
    assert "vit_model.vision_model.encoder.layers.1.mlp.fc2.bias" in ema
    assert "vit_model.vision_model.encoder.layers.2.mlp.fc2.bias" not in ema  # 3 in the file, 2 in the model
    assert ema["vit_model.vision_model.embeddings.patch_embedding.weight"].shape == (32, 588)
    assert ema["vae2llm.weight"].shape == (LLM_HIDDEN, 64) and ema["time_embedder.mlp.0.weight"].shape == (
        LLM_HIDDEN,
        256,
    )
    assert torch.equal(ema["vit_pos_embed.pos_embed"], sincos_2d_table(LLM_HIDDEN, VIT_GRID))
    assert torch.equal(ema["latent_pos_embed.pos_embed"], sincos_2d_table(LLM_HIDDEN, LATENT_GRID))
    assert ae["encoder.conv_out.weight"].shape == (32, 32, 3, 3) and ae["decoder.conv_in.weight"].shape == (
        32,
        16,
        3,
        3,
    )
    norm = ema["vit_model.vision_model.post_layernorm.weight"]
    assert 0.5 < norm.mean() < 1.5 and norm.std() > 0.02  # near 1, but not all 1
    assert ae["encoder.norm_out.bias"].abs().min() > 0


def test_deterministic():
    a, b, c = _make(0), _make(0), _make(1)
    for x, y in zip(a[0].values(), b[0].values()):
        assert torch.equal(x, y)
    assert not torch.equal(a[0]["connector.fc1.weight"], c[0]["connector.fc1.weight"])
    assert not torch.equal(a[2]["decoder.conv_out.weight"], c[2]["decoder.conv_out.weight"])


def test_written_parts_load_with_every_tensor_used(tmp_path):
    ckpt = write_tiny_vision_dir(tmp_path)
    assert json.loads((ckpt / "vit_config.json").read_text())["num_hidden_layers"] == 3
    assert VitConfig.from_dir(ckpt).num_hidden_layers == 2
    ema = load_file(str(ckpt / "ema.safetensors"))
    # strict loads: any missing or unexpected name would raise
    encoder = BagelVisionEncoder.from_pretrained_dir(ckpt, None, LLM_HIDDEN, VIT_GRID)
    latent = LatentEmbedder.from_pretrained_dir(ckpt, LLM_HIDDEN, LATENT_GRID, 2, 16)
    vae = FluxAutoencoder.from_file(ckpt / "ae.safetensors")
    assert set(encoder.state_dict()) | set(latent.state_dict()) == set(ema)
    assert set(vae.state_dict()) == set(load_file(str(ckpt / "ae.safetensors")))
    assert torch.equal(encoder.connector.fc1.weight, ema["connector.fc1.weight"])
