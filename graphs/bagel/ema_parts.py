"""Loading one part of BAGEL from the release's single ``ema.safetensors`` (the whole model's state dict).

Each part (ViT + connector, latent embedder, LLM) keeps the checkpoint's names for its tensors, so
loading is a prefix filter: tensors under the part's prefixes go in by name, every other tensor is
skipped, and any of the part's tensors missing from the file (or a file tensor under the prefixes
that the part has no place for) is one ``WeightsError`` listing them all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from mstar.weights import LoadReport, WeightsError, load_weights, no_random_init

EMA_FILE = "ema.safetensors"

M = TypeVar("M", bound=nn.Module)


def ema_file(path: str | Path) -> Path:
    """``<path>/ema.safetensors``, or ``path`` itself if it names a file."""
    path = Path(path)
    file = path if path.is_file() else path / EMA_FILE
    if not file.is_file():
        raise WeightsError(f"{file}: no such file (expected a BAGEL checkpoint directory with {EMA_FILE})")
    return file


def build_empty(make: Callable[..., M]) -> M:
    """``make(device="meta")`` materialised (uninitialised) on the CPU, ready to be loaded."""
    with no_random_init():
        module = make(device="meta")
    return module.to_empty(device="cpu")


def load_ema_part(
    module: nn.Module,
    path: str | Path,
    prefixes: tuple[str, ...],
    *,
    dtype: torch.dtype | None = None,
    progress: bool = False,
) -> LoadReport:
    """Fill ``module`` (whose names are the checkpoint's) from the ema file's tensors under ``prefixes``."""
    return load_weights(
        module,
        ema_file(path),
        name_map=lambda name: name if name.startswith(prefixes) else None,
        dtype=dtype,
        strict=True,
        progress=progress,
        desc=f"loading {type(module).__name__}",
    )
