"""The generated Qwen3-Omni checkpoint (random weights) in transformers' layout, for tests and benchmarks.

It keeps the released model's structure and its special token ids (so a real Qwen prompt's ids fit), at
widths of 16-64 ("tiny") or scaled-down proportions ("bench"); its config says the weights are random,
and so does every output made from it. ``checkpoints.ensure_tiny_qwen3_omni`` caches it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mstar.weights.save import save_safetensors
from mstar_graphs.qwen3_omni.checkpoints import PREFIXES, build_component, component_state_dicts
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig

SEED = 20260


# preset -> widths: "tiny" for tests; "bench" for benchmarks (the released model's proportions, scaled down:
# 128 experts top-8 become 16 top-4, the Talker's code predictor and Code2Wav keep their depth ratios)
SIZES = {
    "tiny": {
        "hidden": 32,
        "heads": 4,
        "kv": 2,
        "head_dim": 16,
        "thinker_layers": 3,
        "talker_layers": 2,
        "predictor_layers": 2,
        "experts": 4,
        "top_k": 2,
        "moe_inter": 16,
        "audio": 32,
        "audio_layers": 2,
        "vision": 32,
        "vision_layers": 3,
        "deepstack": [0, 1],
        "c2w_hidden": 32,
        "c2w_layers": 2,
        "decoder_dim": 64,
        "mrope": [4, 2, 2],
    },
    "bench": {
        "hidden": 256,
        "heads": 8,
        "kv": 2,
        "head_dim": 32,
        "thinker_layers": 6,
        "talker_layers": 4,
        "predictor_layers": 2,
        "experts": 16,
        "top_k": 4,
        "moe_inter": 128,
        "audio": 128,
        "audio_layers": 4,
        "vision": 128,
        "vision_layers": 4,
        "deepstack": [1, 2, 3],
        "c2w_hidden": 128,
        "c2w_layers": 2,
        "decoder_dim": 192,
        "mrope": [8, 4, 4],
    },
}


def _text(vocab: int, size: dict, layers: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": size["hidden"],
        "intermediate_size": 2 * size["hidden"],
        "num_hidden_layers": layers,
        "num_attention_heads": size["heads"],
        "num_key_value_heads": size["kv"],
        "head_dim": size["head_dim"],
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        **extra,
    }


def tiny_config(preset: str = "tiny") -> dict[str, Any]:
    """A config.json transformers' Qwen3OmniMoeForConditionalGeneration builds from, with real token ids."""
    if preset not in SIZES:
        raise ValueError(f"unknown Qwen3-Omni preset {preset!r} (known: {sorted(SIZES)})")
    z = SIZES[preset]
    mrope = {
        "rope_type": "default",
        "rope_theta": 1_000_000.0,
        "mrope_section": z["mrope"],
        "interleaved": True,
        "mrope_interleaved": True,
    }
    moe = {
        "moe_intermediate_size": z["moe_inter"],
        "num_experts": z["experts"],
        "num_experts_per_tok": z["top_k"],
        "norm_topk_prob": True,
    }
    media = {
        "audio_token_id": 151675,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "audio_start_token_id": 151669,
        "position_id_per_seconds": 13,
    }
    return {
        "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
        "model_type": "qwen3_omni_moe",
        "mstar_random_weights": True,
        "thinker_config": {
            "text_config": _text(
                152064,
                z,
                z["thinker_layers"],
                rope_parameters=dict(mrope),
                decoder_sparse_step=1,
                mlp_only_layers=[],
                tie_word_embeddings=False,
                **moe,
            ),
            "audio_config": {
                "num_mel_bins": 128,
                "encoder_layers": z["audio_layers"],
                "encoder_attention_heads": 2,
                "encoder_ffn_dim": 2 * z["audio"],
                "d_model": z["audio"],
                "output_dim": z["hidden"],
                "n_window": 50,
                "n_window_infer": 800,
                "conv_chunksize": 500,
                "downsample_hidden_size": 8,
                "max_source_positions": 1500,
            },
            "vision_config": {
                "depth": z["vision_layers"],
                "hidden_size": z["vision"],
                "intermediate_size": 2 * z["vision"],
                "num_heads": 2,
                "in_channels": 3,
                "patch_size": 16,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "out_hidden_size": z["hidden"],
                "num_position_embeddings": 2304,
                "deepstack_visual_indexes": z["deepstack"],
            },
            "user_token_id": 872,
            "tie_word_embeddings": False,
            **media,
        },
        "talker_config": {
            "text_config": _text(
                3072,
                z,
                z["talker_layers"],
                rope_parameters=dict(mrope),
                shared_expert_intermediate_size=z["hidden"],
                **moe,
            ),
            "code_predictor_config": _text(
                2048,
                z,
                z["predictor_layers"],
                num_code_groups=16,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            ),
            "num_code_groups": 16,
            "thinker_hidden_size": z["hidden"],
            "accept_hidden_layer": z["thinker_layers"] - 1,
            "codec_bos_id": 2149,
            "codec_eos_token_id": 2150,
            "codec_pad_id": 2148,
            "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156,
            "codec_think_eos_id": 2157,
            "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
            "spatial_merge_size": 2,
            **media,
        },
        "code2wav_config": {
            "codebook_size": 2048,
            "hidden_size": z["c2w_hidden"],
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 2 * z["c2w_hidden"],
            "num_hidden_layers": z["c2w_layers"],
            "num_quantizers": 16,
            "sliding_window": 72,
            "rms_norm_eps": 1e-5,
            "layer_scale_initial_scale": 0.01,
            "upsample_rates": [8, 5, 4, 3],
            "upsampling_ratios": [2, 2],
            "decoder_dim": z["decoder_dim"],
            "max_position_embeddings": 8000,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "enable_audio_output": True,
        "im_start_token_id": 151644,
        "im_end_token_id": 151645,
        "tts_pad_token_id": 151671,
        "tts_bos_token_id": 151672,
        "tts_eos_token_id": 151673,
        "system_token_id": 8948,
        "user_token_id": 872,
        "assistant_token_id": 77091,
    }


@torch.no_grad()
def _randomise(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Every parameter random (norm gains near 1, scales and biases small), so no part is a no-op."""
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        noise = torch.randn(p.shape, generator=generator)
        if "norm" in name and leaf == "weight":
            p.copy_(1.0 + 0.1 * noise)
        elif leaf in ("bias", "alpha", "beta"):
            p.copy_(0.1 * noise)
        elif leaf in ("scale", "gamma"):
            p.copy_(0.1 + 0.05 * noise)
        elif p.dim() >= 2:
            fan_in = p[0].numel() if p.dim() > 1 else 1
            p.copy_(noise / max(1.0, fan_in) ** 0.5)
        else:
            p.copy_(0.1 * noise)


@torch.no_grad()
def _quieten(code2wav, generator: torch.Generator) -> None:
    """Random weights drive the waveform into its [-1, 1] clamp, which would hide every difference:
    halve the last convolution until under 1% of the samples of random codes are clipped."""
    codes = torch.randint(0, code2wav.cfg.codebook_size, (1, code2wav.cfg.num_quantizers, 20), generator=generator)
    last = code2wav.decoder[-1].conv
    while (code2wav.decode(codes).abs() >= 1.0).float().mean() > 0.01:
        last.weight.mul_(0.5)
        last.bias.mul_(0.5)


def write_tiny_checkpoint(directory: str | Path, seed: int = SEED, preset: str = "tiny") -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg_dict = tiny_config(preset)
    config = Qwen3OmniConfig.from_json(json.dumps(cfg_dict))
    generator = torch.Generator().manual_seed(seed)
    modules = {name: build_component(name, config) for name in PREFIXES}
    for name, module in modules.items():
        if name != "vision_encoder":
            _randomise(module, generator)
    _quieten(modules["code2wav"], generator)
    _randomise(
        modules["vision_encoder"], torch.Generator().manual_seed(seed + 1)
    )  # added later: the others' draws stay
    save_safetensors(component_state_dicts(modules), directory)
    (directory / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    (directory / "generation_config.json").write_text(json.dumps({"_from_model_config": True}) + "\n")
    from mstar_graphs.qwen3_omni.chat import build_tiny_tokenizer

    build_tiny_tokenizer(config.thinker_config.text_config.vocab_size).save(str(directory / "tokenizer.json"))
    from mstar_graphs.qwen3_omni.image_processor import write_preprocessor_config

    write_preprocessor_config(directory)  # the released model's image (and audio) preprocessing
    return directory
