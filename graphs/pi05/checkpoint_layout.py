"""What a pi0.5 checkpoint directory holds, found without reading a single weight.

Two released layouts (and our generated one, which is LeRobot's):

- **LeRobot** (``config.json`` with ``"type": "pi05"``): ``model.safetensors`` (names with or
  without ``model.``), ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with their
  normaliser ``*.safetensors``. ``input_features`` name the cameras
  (``observation.images.<name>``, in order; ``empty_camera_<i>`` placeholders are always
  masked) and the state; ``output_features["action"]`` the action dims.
- **openpi** PyTorch conversion (``config.json`` with ``action_dim``, ``action_horizon``,
  ``paligemma_variant``...): ``model.safetensors`` (no ``model.`` prefix) and
  ``assets/<asset_id>/norm_stats.json``. Cameras are openpi's three (``base_0_rgb``,
  ``left_wrist_0_rgb``, ``right_wrist_0_rgb``); state and action dims are those of the
  statistics.

:func:`inspect_checkpoint` checks every file a load needs (config, weights index, statistics,
tokenizer) and fails naming what is missing, before any weight is read. LeRobot saves no
tokenizer: ``checkpoint info`` inspects with ``tokenizer_required=False`` so it can show all it
found before naming the missing tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from mstar_graphs.common.config_loader import ConfigError
from mstar_graphs.pi05.config import Pi05Config
from mstar_graphs.pi05.norm_stats import lerobot_normalization, openpi_normalization
from mstar_graphs.pi05.normalization import Normalization
from mstar_graphs.pi05.tokenizer import TokenizerError, find_tokenizer

IMAGE_PREFIX = "observation.images."
OPENPI_CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
EMPTY_CAMERA_PREFIX = "empty_camera_"


class CheckpointError(ValueError):
    """A checkpoint directory that lacks a file a load needs, or whose files disagree."""


class _Feature(msgspec.Struct):
    type: str
    shape: list[int]


class _Features(msgspec.Struct):
    """The fields of config.json this module reads (everything else is Pi05Config's or ignored)."""

    type: str | None = None
    discrete_state_input: bool | None = None  # openpi's full config only; its converter does not write it
    input_features: dict[str, _Feature] = {}
    output_features: dict[str, _Feature] = {}
    empty_cameras: int = 0
    mstar_random_weights: bool = False


@dataclass(frozen=True)
class CheckpointLayout:
    path: Path
    kind: str  # "lerobot" | "openpi"
    config: Pi05Config
    weight_files: tuple[Path, ...]
    cameras: tuple[str, ...]  # camera names, in the model's order (placeholders excluded)
    placeholder_cameras: tuple[str, ...]  # LeRobot's empty_camera_<i>: always masked, never fed
    state_dim: int | None  # None: whatever the robot gives (no statistics say otherwise)
    action_dim: int | None  # the dims a robot gets (the model computes config.action_dim); None: the
    # checkpoint does not say (no statistics): the robot's joints decide
    normalization: Normalization | None
    tokenizer_file: Path | None  # None only when inspected with tokenizer_required=False and none was found
    notes: tuple[str, ...] = field(default=())
    tokenizer_missing: str | None = None  # then: which tokenizer is missing and every path tried

    @property
    def random_weights(self) -> bool:
        return self.config.random_weights


def weight_files(directory: Path) -> tuple[Path, ...]:
    """The file the weights loader will open (model.safetensors, else a sharded index)."""
    for name in ("model.safetensors", "model.safetensors.index.json"):
        if (directory / name).is_file():
            return (directory / name,)
    raise CheckpointError(
        f"{directory}: no model.safetensors (or model.safetensors.index.json): "
        "expected a pi0.5 PyTorch checkpoint (LeRobot's or openpi's conversion)"
    )


def _read_features(file: Path) -> _Features:
    try:
        return msgspec.json.decode(file.read_bytes(), type=_Features)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{file}: {exc}") from None


def _lerobot_cameras(features: _Features, file: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = [k.removeprefix(IMAGE_PREFIX) for k, f in features.input_features.items() if f.type == "VISUAL"]
    for key, f in features.input_features.items():
        if f.type == "VISUAL" and not key.startswith(IMAGE_PREFIX):
            raise CheckpointError(f"{file}: input_features: image feature {key!r} is not under {IMAGE_PREFIX!r}")
    placeholders = [n for n in names if n.startswith(EMPTY_CAMERA_PREFIX)]
    placeholders += [
        f"{EMPTY_CAMERA_PREFIX}{i}"
        for i in range(features.empty_cameras)
        if f"{EMPTY_CAMERA_PREFIX}{i}" not in placeholders
    ]
    cameras = tuple(n for n in names if not n.startswith(EMPTY_CAMERA_PREFIX))
    if not cameras:
        raise CheckpointError(f"{file}: input_features name no camera (observation.images.*)")
    return cameras, tuple(placeholders)


def _dim(features: dict[str, _Feature], key: str, file: Path) -> int | None:
    feature = features.get(key)
    if feature is None:
        return None
    if len(feature.shape) != 1 or feature.shape[0] <= 0:
        raise CheckpointError(f"{file}: {key}: shape must be [dims], got {feature.shape}")
    return feature.shape[0]


def checkpoint_directory(path: str | Path) -> Path:
    """``path`` if it is a directory with a config.json; else CheckpointError saying which is not so."""
    directory = Path(path)
    expected = "expected a pi0.5 PyTorch checkpoint directory: LeRobot's or openpi's conversion"
    if not directory.exists():
        raise CheckpointError(f"{directory}: no such directory ({expected})")
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory ({expected}; give the folder that holds config.json)")
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: no config.json ({expected})")
    return directory


def inspect_checkpoint(
    path: str | Path,
    *,
    tokenizer: str | Path | None = None,
    asset_id: str | None = None,
    tokenizer_required: bool = True,
) -> CheckpointLayout:
    """The layout of the checkpoint at ``path`` and every file a load would use (nothing read but
    config, processor JSON, statistics and file names). Raises CheckpointError / ConfigError /
    NormalizationError / TokenizerError naming the path at fault; with ``tokenizer_required=False``
    a missing tokenizer is reported in ``tokenizer_missing`` instead."""
    directory = checkpoint_directory(path)
    file = directory / "config.json"
    config = Pi05Config.from_dir(directory)
    features = _read_features(file)
    weights = weight_files(directory)
    tokenizer_file: Path | None = None
    tokenizer_missing: str | None = None
    try:
        tokenizer_file = find_tokenizer(directory, tokenizer)
    except TokenizerError as exc:
        if tokenizer_required:
            raise
        tokenizer_missing = str(exc)
    notes: list[str] = []
    if features.type == "pi05":
        kind = "lerobot"
        cameras, placeholders = _lerobot_cameras(features, file)
        normalization = lerobot_normalization(directory)
        stats_state = normalization.state.dim if normalization else None
        state_dim = _dim(features.input_features, "observation.state", file) or stats_state
        action_dim = _dim(features.output_features, "action", file) or config.action_dim
    else:
        kind = "openpi"
        cameras, placeholders = OPENPI_CAMERAS, ()
        normalization = openpi_normalization(directory, asset_id)
        state_dim = normalization.state.dim if normalization else None
        action_dim = normalization.action.dim if normalization else None
        if normalization is None:
            notes.append(
                "no assets/<asset_id>/norm_stats.json (openpi's converter copies assets only from beside "
                "the JAX checkpoint): state and actions are scaled by the joint limits, and the robot's "
                "joints give the action dims"
            )
        if features.discrete_state_input is None:
            notes.append(
                "discrete_state_input not in config.json (openpi's converter does not write it): the state "
                "goes into the prompt, as pi05_droid / pi05_base were trained; a pi05_libero conversion "
                'needs "discrete_state_input": false added to its config.json'
            )
    if action_dim is not None and action_dim > config.action_dim:
        raise CheckpointError(
            f"{file}: the robot's action has {action_dim} dims, more than the model's {config.action_dim}"
        )
    if normalization is not None:
        for name, dim, want in (
            ("state", normalization.state.dim, state_dim),
            ("action", normalization.action.dim, action_dim),
        ):
            if dim is not None and want is not None and dim != want:
                raise CheckpointError(f"{directory}: {name} statistics have {dim} dims, the config says {want}")
    return CheckpointLayout(
        directory,
        kind,
        config,
        weights,
        cameras,
        placeholders,
        state_dim,
        action_dim,
        normalization,
        tokenizer_file,
        tuple(notes),
        tokenizer_missing,
    )


def describe(
    layout: CheckpointLayout, sizes: dict[str, Any] | None = None, shapes: list[str] | None = None
) -> list[str]:
    """What a load would use, as lines (``mstar-ros checkpoint info``); ``shapes``: lines on how the
    sizes compare with the tensors' shapes, printed after them."""
    c = layout.config
    lines = [
        f"checkpoint: {layout.path}",
        f"layout: {layout.kind}" + (" (generated, RANDOM weights)" if layout.random_weights else ""),
        f"weights: {', '.join(f.name for f in layout.weight_files)} ({c.dtype})",
    ]
    if sizes:
        lines.append("sizes: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    lines += [
        f"vision: SigLIP {c.vision.width} wide, {c.vision.depth} layers, {c.vision.image_size} px, "
        f"{c.vision.num_patches} tokens per camera",
        f"prefix LM: Gemma {c.prefix.width} wide, {c.prefix.depth} layers, {c.prefix.num_heads} heads "
        f"({c.prefix.num_kv_heads} KV), head_dim {c.prefix.head_dim}",
        f"action expert: {c.expert.width} wide, {c.expert.depth} layers; {c.num_steps} flow steps, "
        f"chunk {c.action_horizon} x {c.action_dim}",
        *(shapes or []),
        f"cameras: {', '.join(layout.cameras)}"
        + (f" (+ always masked: {', '.join(layout.placeholder_cameras)})" if layout.placeholder_cameras else ""),
        f"state: {layout.state_dim if layout.state_dim is not None else 'any number of'} dims"
        + (" (as text in the prompt)" if c.discrete_state_input else " (not in the prompt)"),
        f"action: {layout.action_dim if layout.action_dim is not None else 'the robot joints'} dims "
        f"(of the model's {c.action_dim})",
        "normalisation: "
        + (
            layout.normalization.describe()
            if layout.normalization
            else "none in the checkpoint: scaled by the robot's joint limits"
        ),
        f"tokenizer: {layout.tokenizer_file or 'NONE FOUND'} (prompt budget {c.max_token_len} tokens)",
    ]
    return lines + [f"note: {n}" for n in layout.notes]
