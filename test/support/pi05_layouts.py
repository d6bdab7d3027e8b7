"""pi0.5 checkpoint fixtures in the released layouts, written by test code from the formats' documented shapes.

- ``train_sentencepiece``: a small SentencePiece model trained by ``sentencepiece`` itself,
  with Gemma's special ids and PaliGemma's settings (what openpi ships as
  ``paligemma_tokenizer.model``).
- ``lerobot_checkpoint`` / ``openpi_checkpoint``: the generated tiny weights re-laid as a
  LeRobot policy directory (``config.json`` with features, ``model.safetensors`` with
  ``model.`` names, processor pipelines with normaliser safetensors) or as openpi's PyTorch
  conversion (openpi's five config fields, no ``model.`` prefix,
  ``assets/<asset_id>/norm_stats.json``), with statistics chosen by the test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SP_CORPUS = [
    "pick up the red cube and place it in the bowl",
    "open the top drawer",
    "close the microwave door",
    "put the spoon next to the plate",
    "Task: go, State: 12 34 255 -1;\nAction: ",
] * 20 + [" ".join(str((i * 37 + k) % 256) for k in range(16)) for i in range(64)]


def train_sentencepiece(directory: Path, *, dummy_prefix: bool = False) -> Path:
    """A small SentencePiece BPE model with Gemma's special ids (pad 0, eos 1, bos 2, unk 3) and, like
    PaliGemma's, no dummy prefix and an identity normaliser; trained by ``sentencepiece`` itself."""
    import sentencepiece

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(SP_CORPUS))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=300,
        model_type="bpe",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        byte_fallback=True,
        character_coverage=1.0,
        add_dummy_prefix=dummy_prefix,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        minloglevel=2,
    )
    return directory / "tokenizer.model"


def _weights(tiny: Path) -> dict:
    """The generated checkpoint's tensors under openpi's names."""
    from safetensors.torch import load_file

    return {k.removeprefix("model."): v for k, v in load_file(str(tiny / "model.safetensors")).items()}


def _model_fields(tiny: Path) -> dict:
    """The generated checkpoint's model sizes (its non-standard variants need them)."""
    config = json.loads((tiny / "config.json").read_text())
    return {k: config[k] for k in ("paligemma_variant", "action_expert_variant", "mstar_dims", "mstar_random_weights")}


def lerobot_checkpoint(
    out: Path,
    tiny: Path,
    stats: dict[str, dict[str, list[float]]],
    *,
    modes: dict[str, str] | None = None,
    cameras: tuple[str, ...] = ("base_0_rgb", "wrist"),
    state_dim: int = 8,
    action_dim: int = 8,
    empty_cameras: int = 0,
    tokenizer: bool = True,
    eps: float = 1e-8,
) -> Path:
    """A LeRobot pi05 policy directory: ``stats`` {"observation.state": {"q01": [...], ...}, "action": {...}}."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    modes = modes or {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    inputs = {f"observation.images.{c}": {"type": "VISUAL", "shape": [3, 224, 224]} for c in cameras}
    inputs["observation.state"] = {"type": "STATE", "shape": [state_dim]}
    outputs = {"action": {"type": "ACTION", "shape": [action_dim]}}
    config = {
        "type": "pi05",
        "n_obs_steps": 1,
        "input_features": inputs,
        "output_features": outputs,
        "device": "cpu",
        "chunk_size": 50,
        "n_action_steps": 50,
        "max_state_dim": 32,
        "max_action_dim": 32,
        "num_inference_steps": 10,
        "dtype": "float32",
        "image_resolution": [224, 224],
        "empty_cameras": empty_cameras,
        "tokenizer_max_length": 200,
        "normalization_mapping": modes,
        **_model_fields(tiny),
    }
    (out / "config.json").write_text(json.dumps(config, indent=4))
    save_file({f"model.{k}": v.contiguous() for k, v in _weights(tiny).items()}, str(out / "model.safetensors"))
    flat = {
        f"{key}.{name}": torch.tensor(values, dtype=torch.float32)
        for key, named in stats.items()
        for name, values in named.items()
    }
    pre_file, post_file = (
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    )
    save_file(flat, str(out / pre_file))
    save_file(flat, str(out / post_file))

    def step(name, config, state=None):
        return {
            "registry_name": name,
            "config": config,  # noqa: E731
            **({"state_file": state} if state else {}),
        }

    pre = {
        "name": "policy_preprocessor",
        "steps": [
            step("rename_observations_processor", {"rename_map": {}}),
            step("to_batch_processor", {}),
            step("relative_actions_processor", {"enabled": False, "exclude_joints": ["gripper"], "action_names": None}),
            step("normalizer_processor", {"eps": eps, "features": {**inputs, **outputs}, "norm_map": modes}, pre_file),
            step("pi05_prepare_state_tokenizer_processor_step", {}),
            step(
                "tokenizer_processor",
                {
                    "max_length": 200,
                    "task_key": "task",
                    "padding_side": "right",
                    "padding": "max_length",
                    "truncation": True,
                    "tokenizer_name": "google/paligemma-3b-pt-224",
                },
            ),
            step("device_processor", {"device": "cpu", "float_dtype": None}),
        ],
    }
    post = {
        "name": "policy_postprocessor",
        "steps": [
            step("unnormalizer_processor", {"eps": eps, "features": outputs, "norm_map": modes}, post_file),
            step("absolute_actions_processor", {"enabled": False}),
            step("device_processor", {"device": "cpu", "float_dtype": None}),
        ],
    }
    (out / "policy_preprocessor.json").write_text(json.dumps(pre, indent=2))
    (out / "policy_postprocessor.json").write_text(json.dumps(post, indent=2))
    if tokenizer:
        shutil.copy(tiny / "tokenizer.json", out / "tokenizer.json")
    return out


def openpi_checkpoint(
    out: Path,
    tiny: Path,
    stats: dict[str, dict[str, list[float]]] | None,
    *,
    asset_ids: tuple[str, ...] = ("physical-intelligence/libero",),
    tokenizer: bool = True,
) -> Path:
    """openpi's PyTorch conversion: ``stats`` {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}
    under ``assets/<asset_id>/norm_stats.json`` for each asset id (None: no assets, as the converter
    often leaves it)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {
        "action_dim": 32,
        "action_horizon": 50,  # + paligemma_variant, action_expert_variant, as openpi writes
        "precision": "float32",
        **_model_fields(tiny),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in _weights(tiny).items()}, str(out / "model.safetensors"))
    for asset in asset_ids if stats is not None else ():
        folder = out / "assets" / asset
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}, indent=2))
    if tokenizer:
        shutil.copy(tiny / "tokenizer.json", out / "tokenizer.json")
    return out
