"""Where BAGEL weights come from: the released directory layout, the LLM's name map, the tiny checkpoint.

A released ``ByteDance-Seed/BAGEL-7B-MoT`` directory holds ``llm_config.json``, ``vit_config.json``,
``ema.safetensors`` (the whole ``Bagel`` module's state dict, one file), ``ae.safetensors`` (the
FLUX VAE) and Qwen2.5's tokenizer files. In ``ema.safetensors`` the LLM is ``language_model.model.*``
and ``language_model.lm_head.weight``; the velocity head is ``llm2vae.*``. Those load into
:class:`~mstar_graphs.bagel.llm.BagelLLM` (``model.*``, ``lm_head.*``, ``llm2vae.*``); the vision
and latent-embedding tensors belong to other modules and are skipped here.

``resolve_path(None)`` is our generated tiny checkpoint (random weights), made once into the cache.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from mstar.weights import LoadReport, WeightsError, load_weights
from mstar_graphs.bagel.config import LLM_CONFIG_FILE, BagelConfig
from mstar_graphs.bagel.tiny import PRESETS, write_tiny_bagel
from mstar_graphs.common.cache import cached_dir

log = logging.getLogger("mstar_graphs.bagel")
TINY_VERSION = 2  # bump when the generator changes, so stale caches are not reused

EMA_FILE = "ema.safetensors"
AE_FILE = "ae.safetensors"
VIT_CONFIG_FILE = "vit_config.json"
TOKENIZER_FILE = "tokenizer.json"
RELEASED_FILES = (LLM_CONFIG_FILE, VIT_CONFIG_FILE, EMA_FILE, AE_FILE, TOKENIZER_FILE)

LLM_PREFIX = "language_model."
# ema.safetensors prefixes other modules load (the ViT, its connector, the latent-token embedder)
OTHER_MODULES = ("vit_model.", "connector.", "vit_pos_embed.", "latent_pos_embed.", "time_embedder.", "vae2llm.")


class LayoutError(FileNotFoundError):
    """A directory that is not a BAGEL checkpoint: the message names every missing file."""


def check_layout(path: str | Path) -> Path:
    """``path`` as a directory holding every file a released BAGEL directory has; LayoutError otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise LayoutError(f"{path}: no such directory (expected a BAGEL checkpoint directory)")
    missing = [name for name in RELEASED_FILES if not (path / name).is_file()]
    if missing:
        raise LayoutError(
            f"{path} is not a BAGEL checkpoint directory: missing {', '.join(missing)} "
            f"(a release holds {', '.join(RELEASED_FILES)})"
        )
    return path


def is_random_weights(path: str | Path) -> bool:
    """Whether ``llm_config.json`` says the weights were generated (``"mstar_random_weights": true``)."""
    return BagelConfig.from_dir(path).random_weights


def ensure_tiny_bagel(preset: str = "tiny") -> Path:
    """The generated checkpoint directory for ``preset``, made on first use (RANDOM weights)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown BAGEL preset {preset!r} (known: {sorted(PRESETS)})")
    root = cached_dir(
        f"bagel-{preset}-v{TINY_VERSION}",
        lambda tmp: write_tiny_bagel(tmp / "ckpt", preset),
        f"the {preset} BAGEL checkpoint (RANDOM weights)",
    )
    return root / "ckpt"


def resolve_path(weights: str | Path | None, preset: str = "tiny") -> Path:
    """``weights``: a BAGEL checkpoint directory; None: the generated ``preset`` one."""
    path = ensure_tiny_bagel(preset) if weights is None else check_layout(weights)
    if is_random_weights(path):
        log.warning("BAGEL weights in %s are RANDOM (generated for tests): text and images are noise", path)
    return path


def llm_name(ckpt: str) -> str | None:
    """``ema.safetensors`` name -> BagelLLM parameter name; None skips another module's tensor.
    Anything else is returned as is, so the loader reports it as unexpected by its own name."""
    if ckpt.startswith(LLM_PREFIX):
        return ckpt[len(LLM_PREFIX) :]
    if ckpt.startswith(OTHER_MODULES):
        return None
    return ckpt


def checkpoint_name(ours: str) -> str:
    """BagelLLM parameter name -> its ``ema.safetensors`` name."""
    return ours if ours.startswith("llm2vae.") else LLM_PREFIX + ours


_SECTION = re.compile(r"^  \d+ (?P<kind>missing|unexpected|mis-shaped)")


def load_llm_weights(
    module: torch.nn.Module, path: str | Path, *, dtype: torch.dtype | None = None, progress: bool = False
) -> LoadReport:
    """Load ``<path>/ema.safetensors``'s LLM tensors into ``module`` (strict). Missing tensors are named
    by their checkpoint names (``language_model.model.layers.0...``), unexpected ones as the file has them."""
    file = Path(path) / EMA_FILE
    try:
        return load_weights(module, file, name_map=llm_name, dtype=dtype, progress=progress, desc=f"BAGEL LLM {file}")
    except WeightsError as exc:
        raise WeightsError(_with_checkpoint_names(str(exc))) from None


def _with_checkpoint_names(message: str) -> str:
    """The loader lists missing tensors by our names: give their ``ema.safetensors`` names instead."""
    lines, section = [], ""
    for line in message.splitlines():
        header = _SECTION.match(line)
        if header:
            section = header.group("kind")
        elif section == "missing" and line.startswith("    ") and not line.lstrip().startswith("..."):
            line = "    " + checkpoint_name(line.strip())
        lines.append(line)
    return "\n".join(lines)
