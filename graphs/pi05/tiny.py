"""Deterministic random pi0.5 checkpoints in LeRobot's released layout, for tests, demos and benchmarks.

``write_tiny_pi05(dir)`` writes what a LeRobot pi0.5 policy directory holds:
``config.json`` (LeRobot's fields: ``"type": "pi05"``, ``input_features`` naming two
cameras and an 8-dim state, ``output_features`` an 8-dim action, quantile normalisation;
plus explicit ``mstar_dims`` and ``"mstar_random_weights": true``), one
``model.safetensors`` with LeRobot's tensor names (``model.`` + openpi's:
``model.paligemma_with_expert.paligemma.model.{vision_tower,multi_modal_projector,
language_model}...``, ``...gemma_expert...``, ``model.action_in_proj`` ...), the processor
pipelines ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their normaliser
statistics (state and action statistics differ, as they do for real robots), and a small
byte-level BPE ``tokenizer.json`` with Gemma's specials at their real ids (a real
checkpoint has none: see ``tokenizer``).

Like ``safetensors.torch.save_model``, the tied token embedding is stored once, under
``...paligemma.lm_head.weight``; the expert's unused (untied) ``lm_head`` is stored too.
Same seed, same torch version -> same bytes.

Initialisation: embeddings ~ N(0, 1); projections ~ N(0, 1/fan_in); Gemma norm weights
(used as 1 + w) and biases ~ N(0, 0.1^2); LayerNorm weights ~ 1 + N(0, 0.1^2) - so a
missing or misplaced tensor changes the outputs clearly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mstar.weights import save_safetensors
from mstar_graphs.pi05.config import Pi05Config

SEED = 20250905
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # Gemma ids 0..3

_TINY_DIMS = {
    "vision": dict(image_size=224, patch_size=14, width=32, depth=2, heads=2, mlp_dim=64),
    "paligemma": dict(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=2, head_dim=16),
    "action_expert": dict(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=2, head_dim=16),
    "vocab_size": 1024,
}
# Shapes like the real model (MQA, head_dim 256 -> 64, expert half the LM's width) yet small
# enough for a 2-core CPU; for the serving benchmark.
_BENCH_DIMS = {
    "vision": dict(image_size=224, patch_size=14, width=192, depth=4, heads=3, mlp_dim=768),
    "paligemma": dict(width=512, depth=6, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=64),
    "action_expert": dict(width=256, depth=6, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=64),
    "vocab_size": 1024,
}
#: the generated robot: DROID-like (Franka joints + gripper) with two cameras
CAMERAS = ("base_0_rgb", "left_wrist_0_rgb")
STATE_DIM = ACTION_DIM = 8
JOINT_LOWER = [-2.9, -1.8, -2.9, -3.1, -2.9, -0.1, -2.9, 0.0]
JOINT_UPPER = [2.9, 1.8, 2.9, 0.0, 2.9, 3.8, 2.9, 0.8]


def _features() -> dict[str, Any]:
    images = {f"observation.images.{name}": {"type": "VISUAL", "shape": [3, 224, 224]} for name in CAMERAS}
    return {
        "input_features": {**images, "observation.state": {"type": "STATE", "shape": [STATE_DIM]}},
        "output_features": {"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
    }


PRESETS: dict[str, dict[str, Any]] = {
    name: {
        "type": "pi05",
        "chunk_size": 50,
        "n_action_steps": 50,
        "max_action_dim": 32,
        "max_state_dim": 32,
        "num_inference_steps": 10,
        "tokenizer_max_length": 200,
        "image_resolution": [224, 224],
        "paligemma_variant": f"mstar_{name}",
        "action_expert_variant": f"mstar_{name}_expert",
        "dtype": "float32",
        "empty_cameras": 0,
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
        **_features(),
        "mstar_dims": dims,
        "mstar_random_weights": True,
    }
    for name, dims in (("tiny", _TINY_DIMS), ("bench", _BENCH_DIMS))
}


def robot_statistics() -> dict[str, dict[str, list[float]]]:
    """Statistics a dataset of the generated robot could have (LeRobot's names): the state's
    quantiles sit inside the joint limits; the actions' are wider (commands overshoot a little),
    so a server that mixed the two up would give different actions."""

    def stats(inset: float) -> dict[str, list[float]]:
        lo = [a + inset * (b - a) for a, b in zip(JOINT_LOWER, JOINT_UPPER)]
        hi = [b - inset * (b - a) for a, b in zip(JOINT_LOWER, JOINT_UPPER)]
        mid = [(a + b) / 2 for a, b in zip(lo, hi)]
        return {
            "min": list(JOINT_LOWER),
            "max": list(JOINT_UPPER),
            "mean": mid,
            "std": [(b - a) / 4 for a, b in zip(lo, hi)],
            "q01": lo,
            "q99": hi,
            "q10": [m - (m - a) * 0.8 for m, a in zip(mid, lo)],
            "q90": [m + (b - m) * 0.8 for m, b in zip(mid, hi)],
        }

    return {"observation.state": stats(0.05), "action": stats(-0.02)}


def write_lerobot_processors(
    directory: Path, config: dict[str, Any], statistics: dict[str, dict[str, list[float]]]
) -> None:
    """LeRobot's two processor pipelines for ``config`` (its features and normalization_mapping),
    with ``statistics`` ({feature key: {stat: values}}) in their normaliser state files."""
    from safetensors.torch import save_file

    flat = {
        f"{key}.{stat}": torch.tensor(values, dtype=torch.float32)
        for key, stats in statistics.items()
        for stat, values in stats.items()
    }
    features = {**config["input_features"], **config["output_features"]}
    norm_map = config["normalization_mapping"]
    pre_state, post_state = (
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    )
    save_file(flat, str(directory / pre_state))
    save_file(flat, str(directory / post_state))
    pre = {
        "name": "policy_preprocessor",
        "steps": [
            {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
            {"registry_name": "to_batch_processor", "config": {}},
            {
                "registry_name": "relative_actions_processor",
                "config": {"enabled": False, "exclude_joints": ["gripper"], "action_names": None},
            },
            {
                "registry_name": "normalizer_processor",
                "config": {"eps": 1e-08, "features": features, "norm_map": norm_map},
                "state_file": pre_state,
            },
            {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {}},
            {
                "registry_name": "tokenizer_processor",
                "config": {
                    "max_length": config["tokenizer_max_length"],
                    "task_key": "task",
                    "padding_side": "right",
                    "padding": "max_length",
                    "truncation": True,
                    "tokenizer_name": "google/paligemma-3b-pt-224",
                },
            },
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        ],
    }
    post = {
        "name": "policy_postprocessor",
        "steps": [
            {
                "registry_name": "unnormalizer_processor",
                "config": {"eps": 1e-08, "features": config["output_features"], "norm_map": norm_map},
                "state_file": post_state,
            },
            {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
            {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        ],
    }
    for name, pipeline in (("policy_preprocessor.json", pre), ("policy_postprocessor.json", post)):
        (directory / name).write_text(json.dumps(pipeline, indent=2) + "\n")


_CORPUS = [
    "pick up the red cube and place it in the bowl",
    "open the top drawer",
    "close the microwave door",
    "put the spoon next to the plate",
    "stack the green block on the blue block",
    "wipe the table with the towel",
    "move the cup to the left",
    "push the button",
    "fold the cloth in half",
    "pour water into the glass",
    "Task: pick up the fork, State: 128 127 130 0 255 64 192;\nAction: ",
]


def config_dict(preset: str = "tiny") -> dict[str, Any]:
    """The ``config.json`` content of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    return json.loads(json.dumps(PRESETS[preset]))


def weight_shapes(cfg: Pi05Config) -> list[tuple[str, tuple[int, ...], str]]:
    """(openpi name, shape, init kind), written out independently of our modules."""
    v, p, e = cfg.vision, cfg.prefix, cfg.expert
    out: list[tuple[str, tuple[int, ...], str]] = []
    vt = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
    out += [
        (vt + "embeddings.patch_embedding.weight", (v.width, 3, v.patch_size, v.patch_size), "proj"),
        (vt + "embeddings.patch_embedding.bias", (v.width,), "small"),
        (vt + "embeddings.position_embedding.weight", (v.num_patches, v.width), "unit"),
    ]
    for n in range(v.depth):
        lp = f"{vt}encoder.layers.{n}."
        for norm in ("layer_norm1", "layer_norm2"):
            out += [(f"{lp}{norm}.weight", (v.width,), "layernorm"), (f"{lp}{norm}.bias", (v.width,), "small")]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [
                (f"{lp}self_attn.{proj}.weight", (v.width, v.width), "proj"),
                (f"{lp}self_attn.{proj}.bias", (v.width,), "small"),
            ]
        out += [
            (f"{lp}mlp.fc1.weight", (v.mlp_dim, v.width), "proj"),
            (f"{lp}mlp.fc1.bias", (v.mlp_dim,), "small"),
            (f"{lp}mlp.fc2.weight", (v.width, v.mlp_dim), "proj"),
            (f"{lp}mlp.fc2.bias", (v.width,), "small"),
        ]
    out += [(vt + "post_layernorm.weight", (v.width,), "layernorm"), (vt + "post_layernorm.bias", (v.width,), "small")]
    mm = "paligemma_with_expert.paligemma.model.multi_modal_projector.linear."
    out += [(mm + "weight", (p.width, v.width), "proj"), (mm + "bias", (p.width,), "small")]
    out.append(("paligemma_with_expert.paligemma.lm_head.weight", (cfg.vocab_size, p.width), "unit"))
    out += _gemma_layers("paligemma_with_expert.paligemma.model.language_model.", p.width, cfg, adarms=False)
    out += _gemma_layers("paligemma_with_expert.gemma_expert.model.", e.width, cfg, adarms=True)
    out.append(("paligemma_with_expert.gemma_expert.lm_head.weight", (cfg.vocab_size, e.width), "unit"))
    a = cfg.action_dim
    for name, shape in (
        ("action_in_proj", (e.width, a)),
        ("action_out_proj", (a, e.width)),
        ("time_mlp_in", (e.width, e.width)),
        ("time_mlp_out", (e.width, e.width)),
    ):
        out += [(f"{name}.weight", shape, "proj"), (f"{name}.bias", (shape[0],), "small")]
    return out


def _gemma_layers(prefix: str, width: int, cfg: Pi05Config, *, adarms: bool) -> list[tuple[str, tuple[int, ...], str]]:
    d = cfg.prefix  # heads and head_dim are shared by both stacks
    q, kv, mlp = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, (cfg.expert if adarms else d).mlp_dim

    def norm(name: str) -> list[tuple[str, tuple[int, ...], str]]:
        if adarms:  # openpi's adaRMS: Dense(cond -> scale|shift|gate), no plain scale
            return [(f"{name}.dense.weight", (3 * width, width), "proj"), (f"{name}.dense.bias", (3 * width,), "small")]
        return [(f"{name}.weight", (width,), "small")]

    out: list[tuple[str, tuple[int, ...], str]] = []
    for n in range(d.depth):
        lp = f"{prefix}layers.{n}."
        out += norm(lp + "input_layernorm")
        out += [
            (lp + "self_attn.q_proj.weight", (q, width), "proj"),
            (lp + "self_attn.k_proj.weight", (kv, width), "proj"),
            (lp + "self_attn.v_proj.weight", (kv, width), "proj"),
            (lp + "self_attn.o_proj.weight", (width, q), "proj"),
        ]
        out += norm(lp + "post_attention_layernorm")
        out += [
            (lp + "mlp.gate_proj.weight", (mlp, width), "proj"),
            (lp + "mlp.up_proj.weight", (mlp, width), "proj"),
            (lp + "mlp.down_proj.weight", (width, mlp), "proj"),
        ]
    return out + norm(prefix + "norm")


def random_state_dict(cfg: Pi05Config, seed: int = SEED) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, cfg.dtype)
    state: dict[str, torch.Tensor] = {}
    for name, shape, kind in weight_shapes(cfg):
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "proj":
            t *= (t[0].numel() if t.dim() > 1 else 1) ** -0.5
        elif kind == "small":
            t *= 0.1
        elif kind == "layernorm":
            t = 1.0 + 0.1 * t
        state[name] = t.to(dtype)
    return state


def build_tokenizer(vocab_size: int) -> Any:
    """A small deterministic byte-level BPE; <pad> <eos> <bos> <unk> at Gemma's ids 0..3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 600),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
    )
    numbers = [" ".join(str((i * 37 + k) % 256) for k in range(16)) for i in range(64)]
    tok.train_from_iterator(_CORPUS + numbers, trainer=trainer)
    return tok


def write_tiny_pi05(directory: str | Path, preset: str = "tiny") -> Path:
    """Write a random pi0.5 checkpoint directory in LeRobot's layout (config, weights, processors
    with statistics, tokenizer); returns it."""
    raw = config_dict(preset)
    cfg = Pi05Config.from_dict(raw, source=f"preset {preset!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw, indent=4) + "\n")
    save_safetensors({f"model.{k}": v for k, v in random_state_dict(cfg).items()}, out)  # LeRobot's policy wrapper
    write_lerobot_processors(out, raw, robot_statistics())
    tok = build_tokenizer(cfg.vocab_size)
    if tok.get_vocab_size() > cfg.vocab_size:
        raise RuntimeError(f"tiny tokenizer has {tok.get_vocab_size()} tokens, over vocab_size={cfg.vocab_size}")
    tok.save(str(out / "tokenizer.json"))
    return out
