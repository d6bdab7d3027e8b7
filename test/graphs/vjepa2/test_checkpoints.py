"""Loading V-JEPA 2-AC weights: Meta's file as its hub loader reads it, clear errors otherwise."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from mstar.weights import WeightsError
from mstar_graphs.vjepa2.checkpoints import (
    AC_FILE,
    clean_meta_key,
    hf_encoder_key,
    load_encoder,
    load_predictor,
    resolve_source,
)
from mstar_graphs.vjepa2.config import RELEASED


def test_meta_prefixes_are_dropped_wherever_they_occur():
    assert clean_meta_key("module.backbone.blocks.0.attn.qkv.weight") == "blocks.0.attn.qkv.weight"
    assert clean_meta_key("module.predictor_blocks.3.mlp.fc1.bias") == "predictor_blocks.3.mlp.fc1.bias"
    assert clean_meta_key("backbone.norm.weight") == "norm.weight"
    assert hf_encoder_key("encoder.layer.2.attention.query.weight") == "blocks.2.attn.query.weight"
    assert hf_encoder_key("encoder.layernorm.bias") == "norm.bias"
    assert hf_encoder_key("encoder.embeddings.patch_embeddings.proj.weight") == "patch_embed.proj.weight"
    assert hf_encoder_key("predictor.layer.0.norm1.weight") is None


def test_a_released_file_alone_means_the_released_sizes(tmp_path):
    file = tmp_path / "vjepa2-ac-vitg.pt"
    torch.save({"encoder": {}, "predictor": {}}, file)
    source = resolve_source(file)
    assert source.config == RELEASED and source.config.max_frames == 32 and source.config.frame_tokens == 258


def test_weights_round_trip_through_metas_layout(vj_ckpt, vj_encoder, vj_predictor):
    raw = torch.load(vj_ckpt / AC_FILE, weights_only=True)
    assert all(k.startswith("module.backbone.") for k in raw["encoder"])
    assert (
        all(k.startswith("module.") for k in raw["predictor"])
        and "module.extrinsics_encoder.weight" in raw["predictor"]
    )
    assert torch.equal(vj_predictor.predictor_proj.weight, raw["predictor"]["module.predictor_proj.weight"])
    assert torch.equal(vj_encoder.blocks[1].attn.qkv.bias, raw["encoder"]["module.backbone.blocks.1.attn.qkv.bias"])


def test_missing_and_misshaped_tensors_are_named(tmp_path, vj_ckpt):
    raw = torch.load(vj_ckpt / AC_FILE, weights_only=True)
    del raw["predictor"]["module.action_encoder.bias"]
    raw["predictor"]["module.predictor_proj.weight"] = torch.zeros(3, 3)
    raw["predictor"]["module.mask_tokens"] = torch.zeros(1)
    bad = tmp_path / "bad"
    bad.mkdir()
    torch.save(raw, bad / AC_FILE)
    (bad / "config.json").write_text((vj_ckpt / "config.json").read_text())
    with pytest.raises(WeightsError) as info:
        load_predictor(resolve_source(bad))
    text = str(info.value)
    assert "missing 1: action_encoder.bias" in text and "unexpected 1: mask_tokens" in text
    assert "predictor_proj.weight: checkpoint (3, 3)" in text


def test_a_pickle_with_code_is_refused(tmp_path, vj_ckpt):
    class Evil:
        def __reduce__(self):
            return (print, ("ran code from a checkpoint",))

    bad = tmp_path / "evil"
    bad.mkdir()
    (bad / AC_FILE).write_bytes(pickle.dumps({"encoder": Evil()}))
    (bad / "config.json").write_text((vj_ckpt / "config.json").read_text())
    with pytest.raises(WeightsError, match="weights_only=True"):
        load_encoder(resolve_source(bad))


def test_directory_errors_say_what_was_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError):
        resolve_source(tmp_path / "nope")
    with pytest.raises(ValueError, match=r"no AC checkpoint \(\*\.pt\)"):
        resolve_source(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"encoder": {"width": 65}}))
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="encoder.width"):
        resolve_source(tmp_path)
