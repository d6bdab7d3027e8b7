"""The vision half of a generated (random, deterministic) BAGEL checkpoint in the release's layout.

``vision_tensors_and_config`` gives three things for a preset:

- the ``ema.safetensors`` tensors of the vision side, under their released names:
  ``vit_model.vision_model.*``, ``connector.*``, ``vit_pos_embed.pos_embed``,
  ``latent_pos_embed.pos_embed`` (the real sin-cos tables), ``time_embedder.*``, ``vae2llm.*``;
- the ``vit_config.json`` dict (SigLIP field names; ``num_hidden_layers`` is the layers in the
  file + 1, because BAGEL's loader drops one);
- the ``ae.safetensors`` tensors (FLUX names).

``write_vision_parts`` writes the two files and returns the ema tensors, for the LLM-side writer
to merge into its ``ema.safetensors``.

Initialisation: LayerNorm / GroupNorm weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2), Linear and
conv weights ~ N(0, 1/fan_in), the learned ViT position table ~ N(0, 1) - so a missing or misplaced
tensor changes the outputs. Same generator state, same torch version -> same tensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from mstar_graphs.bagel.autoencoder import FluxAutoencoder, VaeShape
from mstar_graphs.bagel.latent_embed import LatentEmbedder
from mstar_graphs.bagel.vision_encoder import BagelVisionEncoder
from mstar_graphs.bagel.vit_config import VitConfig

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "vit": dict(hidden_size=32, layers=2, num_attention_heads=2, patch_size=14, intermediate_size=64),
        "vae": dict(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=1),
    },
    # the release's SigLIP (1152 wide, 16 heads of 72, MLP 4304, 26 layers) and FLUX VAE (128 channels,
    # mults 1, 2, 4, 4, 2 res blocks) at a quarter of their width, with the bench LLM's 4 layers
    "bench": {
        "vit": dict(hidden_size=288, layers=4, num_attention_heads=4, patch_size=14, intermediate_size=1076),
        "vae": dict(ch=32, ch_mult=(1, 2, 4, 4), num_res_blocks=2),
    },
}


def vit_config_dict(preset: str, vit_grid: int) -> dict[str, Any]:
    """The ``vit_config.json`` content of ``preset`` (image_size = patch_size * vit_grid)."""
    vit = _preset(preset)["vit"]
    return {
        "model_type": "siglip_vision_model",
        "hidden_size": vit["hidden_size"],
        "intermediate_size": vit["intermediate_size"],
        "num_hidden_layers": vit["layers"] + 1,  # BAGEL's loader uses num_hidden_layers - 1
        "num_attention_heads": vit["num_attention_heads"],
        "num_channels": 3,
        "patch_size": vit["patch_size"],
        "image_size": vit["patch_size"] * vit_grid,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "attention_dropout": 0.0,
    }


@torch.no_grad()
def randomise(module: nn.Module, generator: torch.Generator, *, skip: tuple[str, ...] = ()) -> None:
    """Every parameter (except names ending in ``skip``) random, in a fixed order, on the CPU."""
    for name, p in module.named_parameters():
        if name.endswith(skip):
            continue
        leaf = name.rsplit(".", 1)[-1]
        noise = torch.randn(p.shape, generator=generator)
        owner = _owner(module, name)
        if leaf == "bias":
            p.copy_(0.1 * noise)
        elif isinstance(owner, (nn.LayerNorm, nn.GroupNorm)):
            p.copy_(1.0 + 0.1 * noise)
        elif isinstance(owner, nn.Embedding):
            p.copy_(noise)
        else:
            p.copy_(noise / max(1, p[0].numel()) ** 0.5)  # fan_in: a row of a Linear, a filter of a conv


def _owner(module: nn.Module, name: str) -> nn.Module:
    return module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module


def vision_tensors_and_config(
    preset: str,
    llm_hidden: int,
    generator: torch.Generator,
    *,
    vit_grid: int,
    latent_grid: int,
    latent_patch: int,
    latent_channels: int = 16,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
    """(ema tensors of the vision side, vit_config.json dict, ae.safetensors tensors), float32."""
    vae = _preset(preset)["vae"]
    vit_json = vit_config_dict(preset, vit_grid)
    vit_cfg = VitConfig.from_dict(vit_json, source=f"{preset} vit_config")
    encoder = BagelVisionEncoder(vit_cfg, llm_hidden, vit_grid)
    latent = LatentEmbedder(llm_hidden, latent_grid, latent_patch, latent_channels)
    shape = VaeShape(
        ch=vae["ch"], ch_mult=tuple(vae["ch_mult"]), num_res_blocks=vae["num_res_blocks"], z_channels=latent_channels
    )
    ae = FluxAutoencoder(shape)
    sincos = ("pos_embed",)  # keep the real sin-cos tables the constructors made
    randomise(encoder, generator, skip=sincos)
    randomise(latent, generator, skip=sincos)
    randomise(ae, generator)
    ema = {**_tensors(encoder), **_tensors(latent)}
    return ema, vit_json, _tensors(ae)


def write_vision_parts(
    path: str | Path,
    preset: str,
    llm_hidden: int,
    generator: torch.Generator,
    *,
    vit_grid: int,
    latent_grid: int,
    latent_patch: int,
    latent_channels: int = 16,
) -> dict[str, torch.Tensor]:
    """Write ``<path>/vit_config.json`` and ``<path>/ae.safetensors``; return the ema tensors of the vision side."""
    ema, vit_json, ae = vision_tensors_and_config(
        preset,
        llm_hidden,
        generator,
        vit_grid=vit_grid,
        latent_grid=latent_grid,
        latent_patch=latent_patch,
        latent_channels=latent_channels,
    )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vit_config.json").write_text(json.dumps(vit_json, indent=2) + "\n")
    save_file(ae, str(path / "ae.safetensors"), metadata={"format": "pt"})
    return ema


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone().contiguous() for name, t in module.state_dict().items()}


def _preset(preset: str) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"vision preset must be one of {sorted(PRESETS)}, got {preset!r}")
    return PRESETS[preset]
