"""Loading the released pi0.5 PyTorch layouts through mstar.weights; errors name the tensor."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mstar.weights import WeightsError, save_safetensors
from mstar_graphs.pi05.checkpoints import checkpoint_name, ensure_tiny_pi05, name_map, resolve_path
from mstar_graphs.pi05.pi05 import Pi05Model
from mstar_graphs.pi05.siglip import Pi05ImageEncoder
from mstar_graphs.pi05.tiny import write_tiny_pi05

PG = "paligemma_with_expert.paligemma."


@pytest.fixture(scope="module")
def state(ckpt) -> dict[str, torch.Tensor]:
    """The generated checkpoint's tensors under openpi's names (LeRobot's, which it has, lose ``model.``)."""
    return {k.removeprefix("model."): v for k, v in load_file(str(ckpt / "model.safetensors")).items()}


def _write(tmp_path, ckpt, state) -> str:
    shutil.copy(ckpt / "config.json", tmp_path / "config.json")
    save_safetensors(state, tmp_path)
    return str(tmp_path)


def test_every_checkpoint_tensor_has_exactly_one_home(state, model, encoder):
    homes = {"model": set(model.state_dict()), "vision": set(encoder.state_dict())}
    skipped = []
    for name in state:
        owners = [part for part in homes if name_map(part)(name) is not None]
        if not owners:
            skipped.append(name)
            continue
        assert len(owners) == 1, name
        assert name_map(owners[0])(name) in homes[owners[0]], name
    assert skipped == ["paligemma_with_expert.gemma_expert.lm_head.weight"]  # the expert's unused text head
    for part, names in homes.items():  # and every parameter is filled from the checkpoint
        filled = {name_map(part)(n) for n in state} - {None}
        assert names <= filled, sorted(names - filled)[:5]
    assert not (set(state) & {PG + "model.language_model.embed_tokens.weight"})  # openpi keeps lm_head's name


@pytest.mark.parametrize(
    "victim",
    [
        "paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight",
        "paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.bias",
        "paligemma_with_expert.paligemma.lm_head.weight",
        "time_mlp_out.weight",
    ],
)
def test_missing_tensor_is_named(tmp_path, ckpt, state, victim):
    path = _write(tmp_path, ckpt, {k: v for k, v in state.items() if k != victim})
    with pytest.raises(WeightsError) as info:
        Pi05Model.from_pretrained_dir(path, progress=False)
    assert "missing" in str(info.value) and victim in str(info.value), str(info.value)


def test_missing_vision_tensor_is_named(tmp_path, ckpt, state):
    victim = PG + "model.vision_tower.vision_model.encoder.layers.1.self_attn.k_proj.bias"
    path = _write(tmp_path, ckpt, {k: v for k, v in state.items() if k != victim})
    with pytest.raises(WeightsError, match="missing") as info:
        Pi05ImageEncoder.from_pretrained_dir(path, progress=False)
    assert victim in str(info.value)
    Pi05Model.from_pretrained_dir(path, progress=False)  # the LM part does not need it


@pytest.mark.parametrize(
    "victim", ["action_in_proj.weight", PG + "model.language_model.layers.0.self_attn.k_proj.weight"]
)
def test_wrong_shape_is_named(tmp_path, ckpt, state, victim):
    bad = dict(state)
    bad[victim] = torch.zeros(bad[victim].shape[0] + 1, *bad[victim].shape[1:])
    path = _write(tmp_path, ckpt, bad)
    with pytest.raises(WeightsError, match="mis-shaped") as info:
        Pi05Model.from_pretrained_dir(path, progress=False)
    assert victim in str(info.value)


def test_pi0_checkpoint_is_refused_by_name(tmp_path, ckpt, state):
    path = _write(tmp_path, ckpt, {**state, "state_proj.weight": torch.zeros(32, 32)})
    with pytest.raises(WeightsError, match="unexpected") as info:
        Pi05Model.from_pretrained_dir(path, progress=False)
    assert "state_proj.weight" in str(info.value)


@torch.no_grad()
@pytest.mark.parametrize("layout", ["lerobot", "legacy_transformers"])
def test_other_real_layouts_load_the_same_weights(tmp_path, ckpt, state, model, encoder, layout):
    if layout == "lerobot":  # policy wrapper prefix "model.", and both names of the tied embedding
        renamed = {"model." + k: v for k, v in state.items()}
        renamed["model." + PG + "model.language_model.embed_tokens.weight"] = state[PG + "lm_head.weight"]
    else:  # converted with transformers < 4.52
        renamed = {
            k.replace(PG + "model.language_model.", PG + "language_model.model.")
            .replace(PG + "model.vision_tower.", PG + "vision_tower.")
            .replace(PG + "model.multi_modal_projector.", PG + "multi_modal_projector."): v
            for k, v in state.items()
        }
    path = _write(tmp_path, ckpt, renamed)
    for cls, reference in ((Pi05Model, model), (Pi05ImageEncoder, encoder)):
        loaded = cls.from_pretrained_dir(path, progress=False).state_dict()
        for name, tensor in reference.state_dict().items():
            assert torch.equal(loaded[name], tensor), (layout, name)


def test_checkpoint_names_round_trip(model, encoder, state):
    for part, module in (("model", model), ("vision", encoder)):
        for ours in module.state_dict():
            assert name_map(part)(checkpoint_name(ours)) == ours
            assert checkpoint_name(ours) in state


def test_tiny_checkpoint_is_deterministic_and_says_random(tmp_path, ckpt):
    again = write_tiny_pi05(tmp_path / "again")
    for file in (
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
    ):
        assert (again / file).read_bytes() == (ckpt / file).read_bytes(), file
    assert json.loads((ckpt / "config.json").read_text())["mstar_random_weights"] is True


def test_generated_checkpoint_is_cached_and_logged_as_random(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MSTAR_CACHE", str(tmp_path))
    first = ensure_tiny_pi05("tiny")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.WARNING, logger="mstar_graphs.pi05"):
        assert resolve_path(None) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not regenerated
    assert "RANDOM" in caplog.text
    with pytest.raises(FileNotFoundError, match="nothing: no such directory"):
        resolve_path(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_path(tmp_path)
    with pytest.raises(ValueError, match="unknown pi0.5 preset"):
        ensure_tiny_pi05("huge")


def test_a_policy_without_weights_builds_the_same_requests():
    """The node set with a placement builds requests only: config and tokenizer, no tensor materialised."""
    from mstar_graphs.pi05.frontend import Pi05Policy

    light = Pi05Policy.load(load_weights=False)
    full = Pi05Policy.load(progress=False)
    assert all(p.is_meta for p in list(light.model.parameters()) + list(light.encoder.parameters()))
    assert (light.action_horizon, light.action_dim, light.random_weights) == (
        full.action_horizon,
        full.action_dim,
        full.random_weights,
    )
    images, state = torch.randint(0, 255, (2, 224, 224, 3), dtype=torch.uint8), torch.linspace(-1, 1, 8)
    a = light.request(images, state, "stack the blocks", seed=3)
    b = full.request(images, state, "stack the blocks", seed=3)
    assert a.inputs.keys() == b.inputs.keys()
    assert all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
