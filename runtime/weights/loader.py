"""Loading a checkpoint into a module in place: validate everything first, then copy tensor by tensor."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mstar.progress import progress_bar
from mstar.weights.checkpoint_files import CheckpointReader, WeightsError

logger = logging.getLogger("mstar.weights")

_SHOWN = 10  # entries listed per problem kind before "... and N more"


@dataclass
class LoadReport:
    """What ``load_weights`` did. ``missing``/``unexpected`` are only non-empty with ``strict=False``."""

    loaded: int
    skipped: list[str]
    seconds: float
    bytes: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def load_weights(
    module: torch.nn.Module,
    path: str | os.PathLike,
    *,
    name_map: Callable[[str], str | None] | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = True,
    progress: bool = True,
    desc: str | None = None,
) -> LoadReport:
    """Copy a checkpoint's tensors into ``module``'s parameters and persistent buffers, in place.

    ``name_map`` turns a checkpoint name into a module name (``None``: skip the tensor).
    Targets keep their device; values are converted to the target's dtype, or, when
    ``dtype`` is given, every floating target is first converted to ``dtype`` (integer
    buffers are left alone). Names sharing one tensor (tied weights) are one target: loading
    any of them fills it. All problems are collected from the checkpoint headers before
    anything is copied, then raised as one :class:`WeightsError`; ``strict=False`` reports
    missing / unexpected tensors in the result instead, but a shape mismatch always raises.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    start = time.perf_counter()
    reader = CheckpointReader(path)
    targets = module.state_dict(keep_vars=True)
    _check_materialized(targets)
    groups = _tie_groups(targets)

    # Plan from headers only, so a bad checkpoint leaves the module untouched.
    plan: dict[str, str] = {}  # checkpoint name -> module name
    skipped: list[str] = []
    unexpected: list[str] = []
    mis_shaped: list[str] = []
    wrong_shape: set[str] = set()  # module names already reported as mis-shaped, not also as missing
    for ckpt_name, shape in reader.shapes().items():
        target_name = name_map(ckpt_name) if name_map is not None else ckpt_name
        label = ckpt_name if target_name == ckpt_name else f"{ckpt_name} -> {target_name}"
        if target_name is None:
            skipped.append(ckpt_name)
        elif target_name not in targets:
            unexpected.append(label)
        elif tuple(targets[target_name].shape) != shape:
            mis_shaped.append(f"{label}: checkpoint {_fmt(shape)} vs model {_fmt(targets[target_name].shape)}")
            wrong_shape.add(target_name)
        else:
            plan[ckpt_name] = target_name
    filled = {groups[name] for name in [*plan.values(), *wrong_shape]}
    missing_groups = [g for g in dict.fromkeys(groups.values()) if g not in filled]
    missing = [g[0] for g in missing_groups]

    problems = [("mis-shaped", mis_shaped)]
    if strict:
        problems = [
            ("missing from the checkpoint", [_group_label(g) for g in missing_groups]),
            ("unexpected (not in the model)", unexpected),
        ] + problems
    if any(items for _, items in problems):
        raise WeightsError(_problem_message(path, module, problems))

    if dtype is not None:
        _convert_floating(targets, groups, dtype)

    loaded = nbytes = 0
    bar = progress_bar(
        total=len(plan), desc=desc or "loading weights", unit="tensor", disable=not progress, leave=False
    )
    with bar, torch.no_grad():
        for ckpt_name, tensor in reader.tensors(only=plan):
            target = targets[plan[ckpt_name]]
            if tensor.shape != target.shape:  # headers said otherwise; a corrupt file, not a user error
                raise WeightsError(f"{ckpt_name}: checkpoint {_fmt(tensor.shape)} vs model {_fmt(target.shape)}")
            target.copy_(tensor)
            loaded += 1
            nbytes += tensor.nbytes
            bar.update(1)

    report = LoadReport(
        loaded=loaded,
        skipped=skipped,
        seconds=time.perf_counter() - start,
        bytes=nbytes,
        missing=[] if strict else missing,
        unexpected=[] if strict else unexpected,
    )
    logger.info(
        "loaded %d tensors (%.1f MiB) from %s into %s in %.2fs; %d skipped",
        report.loaded,
        report.bytes / 2**20,
        path,
        type(module).__name__,
        report.seconds,
        len(skipped),
    )
    if report.missing or report.unexpected:
        logger.warning(
            "%s",
            _problem_message(
                path,
                module,
                [
                    ("missing from the checkpoint (left as is)", [_group_label(g) for g in missing_groups]),
                    ("unexpected (ignored)", report.unexpected),
                ],
            ),
        )
    return report


def _check_materialized(targets: dict[str, torch.Tensor]) -> None:
    meta = [name for name, t in targets.items() if t.is_meta]
    if meta:
        raise WeightsError(
            f"cannot load into tensors on the meta device ({_shorten(meta)}); "
            f"materialize the module first, e.g. module.to_empty(device=...)"
        )


def _tie_groups(targets: dict[str, torch.Tensor]) -> dict[str, tuple[str, ...]]:
    """Module name -> all names of the same tensor (same object, or same memory and layout)."""
    by_key: dict[object, list[str]] = {}
    for name, t in targets.items():
        if t.numel() == 0:
            key: object = ("id", id(t))  # empty tensors may all report data_ptr 0
        else:
            key = (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        by_key.setdefault(key, []).append(name)
    return {name: tuple(names) for names in by_key.values() for name in names}


def _group_label(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]} (tied with {', '.join(names[1:])})"


def _convert_floating(targets: dict[str, torch.Tensor], groups: dict[str, tuple[str, ...]], dtype: torch.dtype) -> None:
    """Re-type every floating target, once per tie group, keeping ties and current values."""
    for names in dict.fromkeys(groups.values()):
        first = targets[names[0]]
        if not first.is_floating_point() or first.dtype == dtype:
            continue
        new = first.detach().to(dtype)
        # A tied Parameter appears under several names; assign each distinct object once.
        for t in {id(targets[n]): targets[n] for n in names}.values():
            t.data = new


def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def _shorten(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    return shown + (f", ... and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _problem_message(path: str | os.PathLike, module: torch.nn.Module, problems: list[tuple[str, list[str]]]) -> str:
    lines = [f"checkpoint {path} does not match {type(module).__name__}:"]
    for kind, items in problems:
        if not items:
            continue
        lines.append(f"  {len(items)} {kind}:")
        lines.extend(f"    {item}" for item in items[:_SHOWN])
        if len(items) > _SHOWN:
            lines.append(f"    ... and {len(items) - _SHOWN} more")
    return "\n".join(lines)
