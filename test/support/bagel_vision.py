"""A tiny BAGEL checkpoint directory holding only the vision side, for the vision tests.

``ema.safetensors`` here has the vision tensors alone (the real one also has the LLM's); the
loaders under test filter by prefix, so they read it the same way.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from mstar_graphs.bagel.tiny_vision import write_vision_parts

LLM_HIDDEN = 64
VIT_GRID = 6  # ViT position grid: image_size = 14 * 6 = 84
LATENT_GRID = 8  # latent tokens per side at most: 128 px
LATENT_PATCH = 2
LATENT_CHANNELS = 16


def write_tiny_vision_dir(path: Path, seed: int = 0) -> Path:
    ema = write_vision_parts(
        path,
        "tiny",
        LLM_HIDDEN,
        torch.Generator().manual_seed(seed),
        vit_grid=VIT_GRID,
        latent_grid=LATENT_GRID,
        latent_patch=LATENT_PATCH,
        latent_channels=LATENT_CHANNELS,
    )
    save_file(ema, str(path / "ema.safetensors"), metadata={"format": "pt"})
    return path


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())
