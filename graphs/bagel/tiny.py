"""Deterministic random BAGEL checkpoints in the released directory layout, for tests and demos.

``write_tiny_bagel(dir)`` writes what ``ByteDance-Seed/BAGEL-7B-MoT`` holds:

- ``llm_config.json``: Qwen2 fields (model_type ``qwen2``, untied head), plus ``"mstar_bagel"`` (the
  BAGEL-level sizes app.py hardcodes, shrunk: in ``tiny`` 4 x 4 ViT and latent grids, 56 px ViT / 64 px
  VAE transforms) and ``"mstar_random_weights": true``;
- ``ema.safetensors``: the LLM (``language_model.model.*``, ``language_model.lm_head.weight``),
  ``llm2vae.*``, and the vision side's tensors;
- ``vit_config.json``, ``ae.safetensors``: the vision side's (see :func:`_vision_parts`);
- a small byte-level BPE ``tokenizer.json`` (+ ``tokenizer_config.json``, ``vocab.json``,
  ``merges.txt``) whose special tokens sit, as in Qwen2.5, after the BPE vocabulary and below the
  embedding table's padded size.

Tensor names are written out here from the released layout, independently of our modules, so a
loader that maps a name wrongly fails. Initialisation: embeddings ~ N(0, 1), projections
~ N(0, 1/fan_in), norm weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2): a missing or misplaced
tensor changes the outputs. Same seed, same torch version -> same bytes.

Presets: ``tiny`` (tests: widths of 32-64, 2 layers, 64 px images) and ``bench`` (benchmarks: the
release's proportions at a quarter of its width, see ``PRESETS``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mstar_graphs.bagel.config import BagelConfig, BagelDims, LlmConfig
from mstar_graphs.bagel.tokenizer import IM_END, IM_START, VISION_END, VISION_START

SEED = 20250520
ENDOFTEXT = "<|endoftext|>"

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "llm": dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        ),
        "mstar_bagel": dict(
            vit_max_num_patch_per_side=4,
            max_latent_size=4,
            latent_patch_size=2,
            latent_channels=16,
            connector_act="gelu_pytorch_tanh",
            vit_transform=[56, 28, 14],
            vae_transform=[64, 32, 16],
        ),
        "first_special_id": 496,  # the BPE vocabulary (and filler) below it; 501..511: padding rows
    },
    # The released model's proportions at a quarter of its width, for benchmarks (mstar_ros.bench.bagel):
    # head_dim 128 and 7 query heads per KV head as in BAGEL-7B (28 / 4), the MLP 37/7 of the width
    # (18944 / 3584), 4 of its 28 layers, a 4096-token vocabulary; images at half the side (512 px out:
    # 32 x 32 = 1024 latent tokens; a 512 px input gives 35 x 35 = 1225 ViT rows), so image rows
    # outnumber text rows as in the release (4096 latent / 4900 ViT rows at 1024 px).
    "bench": {
        "llm": dict(
            vocab_size=4096,
            hidden_size=896,
            intermediate_size=4736,
            num_hidden_layers=4,
            num_attention_heads=7,
            num_key_value_heads=1,
            max_position_embeddings=8192,
        ),
        "mstar_bagel": dict(
            vit_max_num_patch_per_side=35,
            max_latent_size=32,
            latent_patch_size=2,
            latent_channels=16,
            connector_act="gelu_pytorch_tanh",
            vit_transform=[490, 112, 14],
            vae_transform=[512, 256, 16],
        ),
        "first_special_id": 4080,
    },
}

# Qwen2.5's order; each at first_special_id + index
SPECIALS = (ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END)

_CORPUS = [
    "Describe this image in detail.",
    "What is in the picture? A cat sitting on a red chair next to the window.",
    "A photo of a mountain lake at sunrise, with pine trees and a wooden boat.",
    "Generate an image of a dog running on the beach.",
    "Change the color of the car to blue and add snow on the road.",
    "The quick brown fox jumps over the lazy dog.",
    "<think> Let me think about the answer step by step. </think>",
]


def llm_config_dict(preset: str = "tiny") -> dict[str, Any]:
    """The ``llm_config.json`` content of a preset."""
    if preset not in PRESETS:
        raise ValueError(f"unknown BAGEL preset {preset!r} (known: {sorted(PRESETS)})")
    p = PRESETS[preset]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        **p["llm"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "torch_dtype": "float32",
        "mstar_bagel": dict(p["mstar_bagel"]),
        "mstar_random_weights": True,
    }


def llm_weight_shapes(cfg: LlmConfig, dims: BagelDims) -> list[tuple[str, tuple[int, ...], str]]:
    """(ema.safetensors name, shape, init kind) of the LLM and llm2vae, from the released layout."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv, inner = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    out: list[tuple[str, tuple[int, ...], str]] = [
        ("language_model.model.embed_tokens.weight", (cfg.vocab_size, h), "unit")
    ]
    for n in range(cfg.num_hidden_layers):
        lp = f"language_model.model.layers.{n}."
        for s in ("", "_moe_gen"):
            out += [
                (f"{lp}self_attn.q_proj{s}.weight", (q, h), "proj"),
                (f"{lp}self_attn.q_proj{s}.bias", (q,), "bias"),
                (f"{lp}self_attn.k_proj{s}.weight", (kv, h), "proj"),
                (f"{lp}self_attn.k_proj{s}.bias", (kv,), "bias"),
                (f"{lp}self_attn.v_proj{s}.weight", (kv, h), "proj"),
                (f"{lp}self_attn.v_proj{s}.bias", (kv,), "bias"),
                (f"{lp}self_attn.o_proj{s}.weight", (h, q), "proj"),
                (f"{lp}self_attn.q_norm{s}.weight", (d,), "norm"),
                (f"{lp}self_attn.k_norm{s}.weight", (d,), "norm"),
                (f"{lp}mlp{s}.gate_proj.weight", (inner, h), "proj"),
                (f"{lp}mlp{s}.up_proj.weight", (inner, h), "proj"),
                (f"{lp}mlp{s}.down_proj.weight", (h, inner), "proj"),
                (f"{lp}input_layernorm{s}.weight", (h,), "norm"),
                (f"{lp}post_attention_layernorm{s}.weight", (h,), "norm"),
            ]
    out += [
        ("language_model.model.norm.weight", (h,), "norm"),
        ("language_model.model.norm_moe_gen.weight", (h,), "norm"),
        ("language_model.lm_head.weight", (cfg.vocab_size, h), "proj"),
        ("llm2vae.weight", (dims.latent_token_dim, h), "proj"),
        ("llm2vae.bias", (dims.latent_token_dim,), "bias"),
    ]
    return out


def random_llm_tensors(cfg: LlmConfig, dims: BagelDims, generator: torch.Generator) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, shape, kind in llm_weight_shapes(cfg, dims):
        t = torch.randn(shape, generator=generator, dtype=torch.float32)
        if kind == "proj":
            t *= shape[1] ** -0.5
        elif kind == "bias":
            t *= 0.1
        elif kind == "norm":
            t = 1.0 + 0.1 * t
        out[name] = t
    return out


def build_tokenizer(first_special_id: int) -> Any:
    """A byte-level BPE over a few sentences, filler tokens up to ``first_special_id`` (every id below
    it decodes to something), then the specials as added tokens in Qwen2.5's order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(first_special_id, 420),
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    if len(vocab) > first_special_id:
        raise RuntimeError(f"tiny BPE has {len(vocab)} tokens, over first_special_id={first_special_id}")
    taken = set(vocab.values())
    for i in range(first_special_id):
        if i not in taken:
            vocab[f"Ġw{i}"] = i
    data["added_tokens"] = [
        {
            "id": first_special_id + k,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for k, text in enumerate(SPECIALS)
    ]
    return Tokenizer.from_str(json.dumps(data))


def write_tokenizer_files(tok: Any, out: Path) -> None:
    """tokenizer.json plus the slow-tokenizer files (vocab.json, merges.txt) and tokenizer_config.json."""
    tok.save(str(out / "tokenizer.json"))
    tok.model.save(str(out))  # vocab.json, merges.txt
    added = {
        str(tok.token_to_id(text)): {
            "content": text,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for text in SPECIALS
    }
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END, VISION_START, VISION_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 4096,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _vision_parts(
    preset: str, llm_hidden: int, generator: torch.Generator, dims: BagelDims
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
    """The vision side's (ema tensors, vit_config.json content, ae.safetensors tensors): SigLIP NaViT,
    connector, position tables, latent embedder and the FLUX VAE (``tiny_vision``)."""
    from mstar_graphs.bagel.tiny_vision import vision_tensors_and_config

    return vision_tensors_and_config(
        preset,
        llm_hidden,
        generator,
        vit_grid=dims.vit_max_num_patch_per_side,
        latent_grid=dims.max_latent_size,
        latent_patch=dims.latent_patch_size,
        latent_channels=dims.latent_channels,
    )


def write_safetensors_file(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """One safetensors file under a released name (``ema.safetensors``, ``ae.safetensors``)."""
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def write_tiny_bagel(directory: str | Path, preset: str = "tiny") -> Path:
    """Write a random BAGEL checkpoint directory in the released layout; returns it."""
    raw = llm_config_dict(preset)
    cfg = BagelConfig.from_dict(raw, source=f"preset {preset!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm_config.json").write_text(json.dumps(raw, indent=2) + "\n")
    ema = random_llm_tensors(cfg.llm, cfg.dims, torch.Generator().manual_seed(SEED))
    # its own generator: the LLM's draws do not depend on the vision side
    vision_ema, vit_config, ae = _vision_parts(
        preset, cfg.llm.hidden_size, torch.Generator().manual_seed(SEED + 1), cfg.dims
    )
    overlap = sorted(set(ema) & set(vision_ema))
    if overlap:
        raise RuntimeError(f"vision tensors reuse LLM names: {overlap[:5]}")
    write_safetensors_file({**ema, **vision_ema}, out / "ema.safetensors")
    write_safetensors_file(ae, out / "ae.safetensors")
    (out / "vit_config.json").write_text(json.dumps(vit_config, indent=2) + "\n")
    tok = build_tokenizer(PRESETS[preset]["first_special_id"])
    if tok.get_vocab_size(with_added_tokens=True) > cfg.llm.vocab_size:
        raise RuntimeError(f"tiny tokenizer has {tok.get_vocab_size()} tokens, over vocab_size={cfg.llm.vocab_size}")
    write_tokenizer_files(tok, out)
    return out
