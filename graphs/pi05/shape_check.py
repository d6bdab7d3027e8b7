"""The sizes a pi0.5 config gives, checked against the tensor shapes in the checkpoint's safetensors headers.

The sizes come from the config's variant names (``paligemma_variant: gemma_2b``...) or our
``mstar_dims``; weights made for other sizes would otherwise fail only when they are read. The model
is built on the meta device (no memory) and every tensor's shape compared, from the headers alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from mstar.weights import CheckpointReader
from mstar_graphs.pi05.checkpoints import checkpoint_name, name_map
from mstar_graphs.pi05.config import Pi05Config

# our module prefix -> the part it belongs to (the projector is PaliGemma's multi-modal projector)
_PARTS = (("tower.", "vision"), ("projector.", "vision"), ("llm.", "prefix LM"), ("expert.", "action expert"))
UNKNOWN = "not pi0.5"  # checkpoint names no part takes (the loader refuses them too)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class _SizeSources(msgspec.Struct):
    """Where config.json took each part's sizes from (for messages)."""

    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    mstar_dims: dict[str, Any] | None = None


@dataclass(frozen=True)
class PartMismatch:
    """One part whose tensors differ from what the config's sizes build; names are the checkpoint's."""

    part: str
    sizes_from: str
    mis_shaped: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    layers: tuple[int | None, int] | None = None  # (checkpoint, config) when they differ

    def __str__(self) -> str:
        what = []
        if self.layers is not None:
            what.append(f"the checkpoint has {self.layers[0]} layers, the config {self.layers[1]}")
        for items, kind in (
            (self.mis_shaped, "differ in shape"),
            (self.missing, "missing from the checkpoint"),
            (self.unexpected, "in the checkpoint with no place in the model"),
        ):
            if items:
                what.append(f"{len(items)} tensor{'s' if len(items) > 1 else ''} {kind} (first: {items[0]})")
        return f"{self.part} (sizes from {self.sizes_from}): " + "; ".join(what)


@dataclass(frozen=True)
class ShapeCheck:
    tensors: int  # tensors in the checkpoint's headers
    mismatches: tuple[PartMismatch, ...]

    def lines(self) -> list[str]:
        """For ``checkpoint info``, after the architecture lines."""
        if not self.mismatches:
            return [f"shapes: all {self.tensors} tensors in the headers match the sizes above"]
        return [
            "shapes: the tensors in the headers DO NOT MATCH the sizes above:",
            *(f"  {m}" for m in self.mismatches),
        ]

    def problem(self) -> str | None:
        """One line naming the parts that do not match, or None."""
        if not self.mismatches:
            return None
        return (
            f"the checkpoint's tensors do not match the config's sizes in "
            f"{', '.join(m.part for m in self.mismatches)} (shapes: above)"
        )


@dataclass
class _Tally:
    mis_shaped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    layers: set[int] = field(default_factory=set)  # layer indices the checkpoint has


def check_shapes(path: str | Path, config: Pi05Config | None = None) -> ShapeCheck:
    """Compare every tensor of the checkpoint at ``path`` (headers only) with the model ``config`` builds."""
    from mstar_graphs.pi05.pi05 import Pi05Model
    from mstar_graphs.pi05.siglip import Pi05ImageEncoder

    path = Path(path)
    config = config or Pi05Config.from_dir(path)
    modules = (Pi05ImageEncoder(config, device="meta"), Pi05Model(config, device="meta"))
    model = {name: tuple(t.shape) for m in modules for name, t in m.state_dict().items()}
    checkpoint = CheckpointReader(path).shapes()

    tallies: dict[str, _Tally] = {}
    seen: set[str] = set()
    for ckpt, shape in checkpoint.items():
        ours = _ours(ckpt)
        if ours is None:
            continue  # a tensor pi0.5 never uses (the expert's lm_head)
        tally = tallies.setdefault(_part(ours) if ours != ckpt else UNKNOWN, _Tally())
        if layer := _LAYER.search(ours):
            tally.layers.add(int(layer.group(1)))
        if ours not in model:
            tally.unexpected.append(ckpt)
        elif model[ours] != tuple(shape):
            tally.mis_shaped.append(f"{ckpt}: checkpoint {_fmt(shape)} vs config {_fmt(model[ours])}")
        seen.add(ours)
    lerobot = bool(checkpoint) and all(name.startswith("model.") for name in checkpoint)  # its policy wrapper
    for ours in [name for name in model if name not in seen]:  # the model's order: layer 0 first
        tallies.setdefault(_part(ours), _Tally()).missing.append(("model." if lerobot else "") + checkpoint_name(ours))

    sources = _sources(path, config)
    depth = {"vision": config.vision.depth, "prefix LM": config.prefix.depth, "action expert": config.expert.depth}
    mismatches = []
    order = [part for _, part in _PARTS] + [UNKNOWN]
    for part, t in sorted(tallies.items(), key=lambda item: order.index(item[0])):
        layers = (max(t.layers) + 1 if t.layers else None, depth[part]) if part in depth else None
        mismatch = PartMismatch(
            part,
            sources.get(part, "no part of pi0.5"),
            tuple(t.mis_shaped),
            tuple(t.missing),
            tuple(t.unexpected),
            layers if layers is not None and layers[0] != layers[1] else None,
        )
        if mismatch.mis_shaped or mismatch.missing or mismatch.unexpected or mismatch.layers:
            mismatches.append(mismatch)
    return ShapeCheck(len(checkpoint), tuple(mismatches))


def _ours(ckpt: str) -> str | None:
    """The checkpoint name as our module name (itself when no part takes it); None: never loaded."""
    vision = name_map("vision")(ckpt)
    if vision is not None and vision != ckpt:
        return vision
    return name_map("model")(ckpt)


def _part(ours: str) -> str:
    return next((part for prefix, part in _PARTS if ours.startswith(prefix)), UNKNOWN)


def _sources(path: Path, config: Pi05Config) -> dict[str, str]:
    raw = msgspec.json.decode((path / "config.json").read_bytes(), type=_SizeSources)
    dims = raw.mstar_dims or {}
    return {
        "vision": "mstar_dims.vision"
        if "vision" in dims
        else f"pi0.5's SigLIP So400m/14 at {config.vision.image_size} px",
        "prefix LM": "mstar_dims.paligemma" if "paligemma" in dims else f"paligemma_variant {raw.paligemma_variant!r}",
        "action expert": (
            "mstar_dims.action_expert"
            if "action_expert" in dims
            else f"action_expert_variant {raw.action_expert_variant!r}"
        )
        + f" and action_dim {config.action_dim}",
    }


def _fmt(shape: Any) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"
