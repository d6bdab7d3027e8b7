"""The sizes a pi0.5 config gives (variant names, mstar_dims) against the tensor shapes in the headers."""

from __future__ import annotations

import json

from mstar_graphs.pi05.shape_check import check_shapes
from support.pi05_layouts import lerobot_checkpoint, openpi_checkpoint


def _edit_config(path, change) -> None:
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


def test_the_generated_checkpoint_matches_its_sizes(ckpt):
    check = check_shapes(ckpt)
    assert check.mismatches == () and check.problem() is None and check.tensors > 50
    assert check.lines() == [f"shapes: all {check.tensors} tensors in the headers match the sizes above"]


def test_one_wrong_size_is_named_with_its_part_and_tensor(tmp_path, ckpt):
    path = openpi_checkpoint(tmp_path / "ck", ckpt, None)
    _edit_config(path, lambda c: c["mstar_dims"]["paligemma"].update(mlp_dim=96))
    (mismatch,) = check_shapes(path).mismatches
    assert mismatch.part == "prefix LM" and mismatch.sizes_from == "mstar_dims.paligemma"
    assert (
        len(mismatch.mis_shaped) == 6 and not mismatch.missing and not mismatch.unexpected
    )  # 3 MLP weights x 2 layers
    assert (
        "paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.gate_proj.weight: "
        "checkpoint (128, 64) vs config (96, 64)"
    ) in mismatch.mis_shaped


def test_real_variant_names_on_other_weights_name_every_part(tmp_path, ckpt):
    """A LeRobot config saying gemma_2b / gemma_300m beside the tiny weights: each part is named, with the
    variant its sizes came from, the layer counts and the first tensors at fault (LeRobot's names)."""
    path = lerobot_checkpoint(tmp_path / "ck", ckpt, {})

    def real_variants(config):
        del config["mstar_dims"]
        config.update(paligemma_variant="gemma_2b", action_expert_variant="gemma_300m")

    _edit_config(path, real_variants)
    check = check_shapes(path)
    vision, prefix, expert = check.mismatches
    assert (vision.part, prefix.part, expert.part) == ("vision", "prefix LM", "action expert")
    assert prefix.sizes_from == "paligemma_variant 'gemma_2b'" and prefix.layers == (2, 18)
    assert expert.sizes_from == "action_expert_variant 'gemma_300m' and action_dim 32" and expert.layers == (2, 18)
    assert vision.sizes_from == "pi0.5's SigLIP So400m/14 at 224 px" and vision.layers == (2, 27)
    assert (
        prefix.missing[0]
        == "model.paligemma_with_expert.paligemma.model.language_model.layers.2.input_layernorm.weight"
    )
    assert (
        "model.paligemma_with_expert.paligemma.lm_head.weight: checkpoint (1024, 64) vs config (257152, 2048)"
        in prefix.mis_shaped
    )
    assert check.problem() == (
        "the checkpoint's tensors do not match the config's sizes in vision, prefix LM, action expert (shapes: above)"
    )
    assert (
        "prefix LM (sizes from paligemma_variant 'gemma_2b'): the checkpoint has 2 layers, the config 18; "
        in "\n".join(check.lines())
    )


def test_tensors_no_part_takes_are_named(tmp_path, ckpt):
    import torch
    from safetensors.torch import load_file, save_file

    path = openpi_checkpoint(tmp_path / "ck", ckpt, None)
    tensors = load_file(str(path / "model.safetensors"))
    save_file({**tensors, "value_head.weight": torch.zeros(2, 3)}, str(path / "model.safetensors"))
    (mismatch,) = check_shapes(path).mismatches
    assert mismatch.part == "not pi0.5" and mismatch.unexpected == ("value_head.weight",)
