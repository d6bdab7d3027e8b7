"""Where pi0.5 weights come from, and how checkpoint names map onto our two modules.

Released PyTorch layouts (tensor names verified against openpi's
``examples/convert_jax_model_to_pytorch.py`` and LeRobot's ``modeling_pi05.py``):

- ``paligemma_with_expert.paligemma.model.vision_tower.vision_model.*``  -> image encoder ``tower.*``
- ``paligemma_with_expert.paligemma.model.multi_modal_projector.linear.*`` -> image encoder ``projector.*``
- ``paligemma_with_expert.paligemma.model.language_model.*``           -> ``Pi05Model.llm.*``
- ``paligemma_with_expert.paligemma.lm_head.weight`` (tied; openpi's ``save_model`` keeps
  only this name of the pair)                                            -> ``llm.embed_tokens.weight``
- ``paligemma_with_expert.gemma_expert.model.*``                        -> ``expert.model.*``
- ``action_in_proj / action_out_proj / time_mlp_in / time_mlp_out .*``  -> ``expert.*``
- ``paligemma_with_expert.gemma_expert.lm_head.weight``: skipped (the expert never emits text).

LeRobot prefixes every name with ``model.``; checkpoints converted with transformers
< 4.52 spell the PaliGemma part ``paligemma.{language_model.model, vision_tower,
multi_modal_projector}``. Both are accepted. Anything else is reported by the loader.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from mstar.weights import LoadReport, WeightsError, load_weights
from mstar_graphs.common.cache import cached_dir
from mstar_graphs.pi05.checkpoint_layout import CheckpointError, checkpoint_directory
from mstar_graphs.pi05.config import Pi05Config
from mstar_graphs.pi05.tiny import PRESETS, write_tiny_pi05

log = logging.getLogger("mstar_graphs.pi05")
TINY_VERSION = 2  # bump when the generator changes, so stale caches are not reused
Part = Literal["vision", "model"]

_PG = "paligemma_with_expert.paligemma."
_EXPERT = "paligemma_with_expert.gemma_expert."
# (checkpoint prefix, our prefix or None to skip, which module owns it); first match wins
_PREFIXES: list[tuple[str, str | None, Part | None]] = [
    (_PG + "model.vision_tower.vision_model.", "tower.", "vision"),
    (_PG + "vision_tower.vision_model.", "tower.", "vision"),
    (_PG + "model.multi_modal_projector.linear.", "projector.", "vision"),
    (_PG + "multi_modal_projector.linear.", "projector.", "vision"),
    (_PG + "model.language_model.", "llm.", "model"),
    (_PG + "language_model.model.", "llm.", "model"),
    (_PG + "lm_head.weight", "llm.embed_tokens.weight", "model"),
    (_PG + "language_model.lm_head.weight", "llm.embed_tokens.weight", "model"),
    (_EXPERT + "model.", "expert.model.", "model"),
    (_EXPERT + "lm_head.weight", None, None),
    *((f"{p}.", f"expert.{p}.", "model") for p in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out")),
]
# our prefix -> the canonical (openpi) checkpoint prefix, for messages
_CANONICAL = [
    ("tower.", _PG + "model.vision_tower.vision_model."),
    ("projector.", _PG + "model.multi_modal_projector.linear."),
    ("llm.embed_tokens.weight", _PG + "lm_head.weight"),
    ("llm.", _PG + "model.language_model."),
    ("expert.model.", _EXPERT + "model."),
    ("expert.", ""),
]


def name_map(part: Part) -> Callable[[str], str | None]:
    """Checkpoint name -> our parameter name in ``part``'s module; None skips (the other part's)."""

    def mapped(name: str) -> str | None:
        bare = name.removeprefix("model.")  # LeRobot's policy wrapper
        for ckpt, ours, owner in _PREFIXES:
            if bare.startswith(ckpt):
                if owner != part or ours is None:
                    return None
                return ours + bare[len(ckpt) :] if ckpt.endswith(".") else ours
        return name  # unknown: the loader reports it as unexpected, by its checkpoint name

    return mapped


def checkpoint_name(ours: str) -> str:
    """Our parameter name -> the openpi checkpoint name it loads from."""
    for mine, theirs in _CANONICAL:
        if ours.startswith(mine):
            return theirs + ours[len(mine) :] if mine.endswith(".") else theirs
    return ours


_OUR_NAME = re.compile(r"(?<![\w.])((?:tower|projector|llm|expert)\.[\w.]+)")


def load_part(
    module: torch.nn.Module, path: str | Path, part: Part, *, dtype: torch.dtype | None = None, progress: bool = True
) -> LoadReport:
    """Load ``part``'s tensors of the checkpoint at ``path`` into ``module`` (strict).

    Errors name tensors by their checkpoint names (ours appear only after ``->``).
    """
    try:
        return load_weights(
            module,
            path,
            name_map=name_map(part),
            dtype=dtype,
            progress=progress,
            desc=f"pi0.5 {part} {Path(path).name}",
        )
    except WeightsError as exc:
        lines = [
            ln if "->" in ln else _OUR_NAME.sub(lambda m: checkpoint_name(m.group(1)), ln)
            for ln in str(exc).splitlines()
        ]
        raise WeightsError("\n".join(lines)) from None


def ensure_tiny_pi05(preset: str = "tiny") -> Path:
    """The generated checkpoint directory for ``preset``, made on first use (RANDOM weights)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown pi0.5 preset {preset!r} (known: {sorted(PRESETS)})")
    root = cached_dir(
        f"pi05-{preset}-v{TINY_VERSION}",
        lambda tmp: write_tiny_pi05(tmp / "ckpt", preset),
        f"the {preset} pi0.5 checkpoint (RANDOM weights)",
    )
    return root / "ckpt"


def resolve_path(weights: str | Path | None, preset: str = "tiny") -> Path:
    """``weights``: a pi0.5 checkpoint directory (config.json + safetensors); None: the generated one."""
    if weights is None:
        path = ensure_tiny_pi05(preset)
    else:
        try:
            path = checkpoint_directory(weights)
        except CheckpointError as exc:  # a path that is not there (kept a FileNotFoundError, as callers expect)
            raise FileNotFoundError(str(exc)) from None
    if Pi05Config.from_dir(path).random_weights:
        log.warning("pi0.5 weights in %s are RANDOM (generated for tests): the actions are noise", path)
    return path


def parameter_counts(path: str | Path) -> dict[str, str]:
    """Parameters per part of the checkpoint at ``path``, from the safetensors headers alone (no weight
    is read): {"vision": "412.4M", "prefix LM": ..., "action expert": ..., "file": "13.1 GB"}."""
    from math import prod

    from mstar.weights import CheckpointReader

    reader = CheckpointReader(path)
    counts = {"vision": 0, "prefix LM": 0, "action expert": 0, "unused": 0}
    for name, shape in reader.shapes().items():
        ours = name_map("vision")(name)
        if ours is not None and ours != name:
            part = "vision"
        else:
            ours = name_map("model")(name)
            part = (
                "unused"
                if ours is None or ours == name
                else "prefix LM"
                if ours.startswith("llm.")
                else "action expert"
            )
        counts[part] += prod(shape)
    out = {k: _human(v) for k, v in counts.items() if v}
    out["file"] = _human(sum(f.stat().st_size for f in reader.files), unit="B")
    return out


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T"):
        if n < 1000 or suffix == "T":
            return f"{n:.1f}{suffix}{unit}" if suffix else f"{int(n)}{unit}"
        n /= 1000
    raise AssertionError("unreachable")
