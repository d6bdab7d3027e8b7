"""Qwen3-Omni checkpoints: transformers' layout from a directory, or the generated one (``tiny.py``, cached here).

transformers writes (and Qwen releases) ``config.json`` plus safetensors (sharded with an index)
whose names carry the component prefixes ``thinker.model.`` / ``thinker.lm_head`` /
``thinker.audio_tower.`` / ``thinker.visual.`` / ``talker.`` / ``code2wav.``, with MoE experts per
expert (``...mlp.experts.{e}.gate_proj.weight``). Each component loads only its own names
(:func:`load_component`); the experts are fused in memory after loading. The vision tower's
weights are not read yet (no vision walk).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mstar.weights import load_weights, no_random_init
from mstar_graphs.common.cache import cached_dir
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig

log = logging.getLogger("mstar_graphs.qwen3_omni")
TINY_VERSION = 4

# component -> (checkpoint prefix, names under it that belong elsewhere)
PREFIXES = {
    "thinker": ("thinker.", ("thinker.audio_tower.", "thinker.visual.")),
    "audio_encoder": ("thinker.audio_tower.", ()),
    "talker": ("talker.", ()),
    "code2wav": ("code2wav.", ()),
    "vision_encoder": ("thinker.visual.", ()),
}


def build_component(
    name: str, config: Qwen3OmniConfig, dtype: torch.dtype = torch.float32, device: str | None = None
) -> torch.nn.Module:
    from mstar_graphs.qwen3_omni.audio_encoder import AudioEncoder
    from mstar_graphs.qwen3_omni.code2wav import Code2Wav
    from mstar_graphs.qwen3_omni.talker import Talker
    from mstar_graphs.qwen3_omni.thinker import Thinker

    if name == "thinker":
        return Thinker(config, dtype=dtype, device=device)
    if name == "talker":
        return Talker(config, dtype=dtype, device=device)
    if name == "vision_encoder":
        from mstar_graphs.qwen3_omni.vision_encoder import VisionEncoder

        return VisionEncoder(config.thinker_config.vision_config).to(device=device, dtype=dtype)
    if name == "audio_encoder":
        return AudioEncoder(config.thinker_config.audio_config).to(device=device, dtype=dtype)
    if name == "code2wav":
        return Code2Wav(config.code2wav_config).to(device=device, dtype=dtype)
    raise ValueError(f"no Qwen3-Omni component {name!r} (known: {sorted(PREFIXES)})")


def load_component(
    name: str, path: str | Path, dtype: torch.dtype = torch.float32, progress: bool = True
) -> torch.nn.Module:
    """One component with its weights from a checkpoint directory, experts fused, in eval mode."""
    path = Path(path)
    config = Qwen3OmniConfig.from_dir(path)
    prefix, elsewhere = PREFIXES[name]
    with torch.device("meta"), no_random_init():
        module = build_component(name, config, dtype=dtype)
    module.to_empty(device="cpu")
    if hasattr(module, "reset_buffers"):  # non-persistent buffers are in no checkpoint: rebuilt
        module.reset_buffers()

    def name_map(ckpt: str) -> str | None:
        if not ckpt.startswith(prefix) or ckpt.startswith(elsewhere):
            return None
        return ckpt[len(prefix) :]

    load_weights(module, path, name_map=name_map, dtype=dtype, progress=progress, desc=f"Qwen3-Omni {name}")
    if hasattr(module, "fuse_experts"):
        module.fuse_experts()
    return module.eval()


def component_state_dicts(modules: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Unfused modules -> one state dict in the checkpoint's names."""
    out: dict[str, torch.Tensor] = {}
    for name, module in modules.items():
        prefix = PREFIXES[name][0]
        for key, value in module.state_dict().items():
            out[prefix + key] = value
    return out


def ensure_tiny_qwen3_omni(preset: str = "tiny") -> Path:
    from mstar_graphs.qwen3_omni.tiny import write_tiny_checkpoint  # tiny builds with build_component

    return cached_dir(
        f"qwen3-omni-{preset}-v{TINY_VERSION}",
        lambda d: write_tiny_checkpoint(d, preset=preset),
        f"the {preset} Qwen3-Omni checkpoint (random weights)",
    )
