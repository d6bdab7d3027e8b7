"""Reading a checkpoint's normalisation statistics, in LeRobot's and openpi's formats.

LeRobot (>= 0.4) saves its processor pipelines next to the weights:
``policy_preprocessor.json`` / ``policy_postprocessor.json`` are ``{"name", "steps": [...]}``,
each step ``{"registry_name", "config", "state_file"?}``. The ``normalizer_processor`` step
(``config``: ``eps``, ``features`` {key: {type, shape}}, ``norm_map`` {feature type: mode})
keeps its statistics in its ``state_file`` (safetensors, ``"<feature key>.<stat>"`` ->
float32 tensor, e.g. ``observation.state.q01``); the postprocessor's
``unnormalizer_processor`` likewise for ``action``. A feature whose type has no mode, or
whose statistics are absent, is passed through unchanged, as LeRobot does.

openpi keeps ``assets/<asset_id>/norm_stats.json`` (asset ids may hold a slash, e.g.
``physical-intelligence/libero``): ``{"norm_stats": {"state": {"mean", "std", "q01",
"q99"}, "actions": {...}}}``; pi0.5 normalises both with the quantiles.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import torch

from mstar_graphs.pi05.normalization import LEROBOT_EPS, FeatureNormalizer, Mode, Normalization, NormalizationError

log = logging.getLogger("mstar_graphs.pi05")

PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"
STATE_KEY, ACTION_KEY = "observation.state", "action"
#: steps that would change actions in ways this server does not reproduce (yet): refused when enabled
_UNSUPPORTED_STEPS = ("relative_actions_processor", "delta_actions_processor", "absolute_actions_processor")


class _Feature(msgspec.Struct):
    type: str
    shape: list[int]


class _NormConfig(msgspec.Struct):
    features: dict[str, _Feature] = {}
    norm_map: dict[str, str] = {}
    eps: float = LEROBOT_EPS


class _Step(msgspec.Struct):
    registry_name: str | None = None
    config: dict[str, Any] = {}
    state_file: str | None = None


class _Pipeline(msgspec.Struct):
    steps: list[_Step]
    name: str = ""


class _OpenpiStats(msgspec.Struct):
    mean: list[float] | None = None
    std: list[float] | None = None
    q01: list[float] | None = None
    q99: list[float] | None = None


class _OpenpiFile(msgspec.Struct):
    norm_stats: dict[str, _OpenpiStats]


def _read_pipeline(file: Path) -> _Pipeline:
    try:
        return msgspec.json.decode(file.read_bytes(), type=_Pipeline)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise NormalizationError(f"{file}: not a LeRobot processor pipeline: {exc}") from None


def _step(pipeline: _Pipeline, file: Path, name: str) -> _Step | None:
    for step in pipeline.steps:
        if step.registry_name in _UNSUPPORTED_STEPS and step.config.get("enabled"):
            raise NormalizationError(
                f"{file}: step {step.registry_name!r} is enabled (relative actions); this server does not apply it yet"
            )
    return next((s for s in pipeline.steps if s.registry_name == name), None)


def _lerobot_feature(directory: Path, file: Path, step: _Step, key: str) -> FeatureNormalizer:
    """``key``'s normaliser from one normalizer/unnormalizer step, as LeRobot applies it."""
    try:
        config = msgspec.convert(step.config, _NormConfig)
    except msgspec.ValidationError as exc:
        raise NormalizationError(f"{file}: {step.registry_name} config: {exc}") from None
    feature = config.features.get(key)
    if feature is None:
        raise NormalizationError(
            f"{file}: {step.registry_name} has no feature {key!r} (it has {sorted(config.features)})"
        )
    try:
        mode = Mode(config.norm_map.get(feature.type, "IDENTITY"))
    except ValueError:
        raise NormalizationError(
            f"{file}: norm_map: unknown mode {config.norm_map[feature.type]!r} for {feature.type}"
        ) from None
    if mode is Mode.IDENTITY:
        return FeatureNormalizer(mode, {}, "lerobot", config.eps)
    if step.state_file is None:
        raise NormalizationError(f"{file}: {step.registry_name} names no state_file with its statistics")
    stats_file = directory / step.state_file
    if not stats_file.is_file():
        raise NormalizationError(f"{file}: its statistics file {stats_file} is missing")
    from safetensors.torch import load_file

    try:
        flat = load_file(str(stats_file))
    except Exception as exc:  # safetensors raises its own error types
        raise NormalizationError(f"{stats_file}: not a safetensors file: {exc}") from None
    stats = {name.rsplit(".", 1)[1]: t.float().reshape(-1) for name, t in flat.items() if name.rsplit(".", 1)[0] == key}
    if not stats:
        log.warning("%s: no statistics for %s: passed through unnormalised, as LeRobot does", stats_file, key)
        return FeatureNormalizer(Mode.IDENTITY, {}, "lerobot", config.eps)
    norm = FeatureNormalizer(mode, stats, "lerobot", config.eps)
    if feature.shape and norm.dim != feature.shape[-1]:
        raise NormalizationError(f"{stats_file}: {key} statistics have {norm.dim} dims, the feature {feature.shape}")
    return norm


def lerobot_normalization(directory: Path) -> Normalization | None:
    """The state and action normalisers of a LeRobot checkpoint; None without processor files."""
    pre, post = directory / PREPROCESSOR, directory / POSTPROCESSOR
    if not pre.is_file() and not post.is_file():
        return None
    for file in (pre, post):
        if not file.is_file():
            raise NormalizationError(f"{file}: missing (the checkpoint has the other processor file)")
    pre_step = _step(_read_pipeline(pre), pre, "normalizer_processor")
    post_step = _step(_read_pipeline(post), post, "unnormalizer_processor")
    if pre_step is None or post_step is None:
        missing = pre if pre_step is None else post
        raise NormalizationError(f"{missing}: no {'normalizer' if pre_step is None else 'unnormalizer'}_processor step")
    state = _lerobot_feature(directory, pre, pre_step, STATE_KEY)
    action = _lerobot_feature(directory, post, post_step, ACTION_KEY)
    return Normalization(state, action, f"{pre.name} + {post.name}")


def openpi_stats_files(directory: Path) -> list[Path]:
    return sorted((directory / "assets").glob("**/norm_stats.json"))


def openpi_normalization(directory: Path, asset_id: str | None = None) -> Normalization | None:
    """The quantile normalisers of an openpi checkpoint's ``assets/<asset_id>/norm_stats.json``;
    None when it has none. Several asset ids need ``asset_id``."""
    if asset_id is not None:
        file = directory / "assets" / asset_id / "norm_stats.json"
        if not file.is_file():
            found = [str(f.parent.relative_to(directory / "assets")) for f in openpi_stats_files(directory)]
            raise NormalizationError(f"{file}: no such file (asset ids here: {found or 'none'})")
    else:
        files = openpi_stats_files(directory)
        if not files:
            return None
        if len(files) > 1:
            ids = [str(f.parent.relative_to(directory / "assets")) for f in files]
            raise NormalizationError(
                f"{directory}/assets holds statistics for several robots {ids}: choose one with --asset-id"
            )
        file = files[0]
    try:
        stats = msgspec.json.decode(file.read_bytes(), type=_OpenpiFile).norm_stats
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise NormalizationError(f"{file}: not an openpi norm_stats.json: {exc}") from None

    def feature(key: str) -> FeatureNormalizer:
        if key not in stats:
            raise NormalizationError(f"{file}: no statistics for {key!r} (it has {sorted(stats)})")
        s = stats[key]
        if s.q01 is None or s.q99 is None:
            raise NormalizationError(f"{file}: {key}: pi0.5 normalises with quantiles, and q01 / q99 are missing")
        return FeatureNormalizer(
            Mode.QUANTILES,
            {"q01": torch.tensor(s.q01, dtype=torch.float64), "q99": torch.tensor(s.q99, dtype=torch.float64)},
            "openpi",
        )

    return Normalization(feature("state"), feature("actions"), str(file.relative_to(directory)))
