"""Finding and reading checkpoint files: single or sharded safetensors, and torch .bin files.

A checkpoint path is either a file (``.safetensors``, ``.bin``/``.pt``/``.pth`` or a
``*.index.json``) or a directory holding, in order of preference, ``model.safetensors``,
a ``*.safetensors.index.json`` (HF sharded layout), ``pytorch_model.bin`` or
``pytorch_model.bin.index.json``. Safetensors are read lazily, one tensor at a time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Container, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
_BIN_SUFFIXES = (".bin", ".pt", ".pth")


class WeightsError(ValueError):
    """A checkpoint cannot be read or does not match the model; the message names every offender."""


def _is_safetensors(file: Path) -> bool:
    return file.name.endswith(".safetensors")


class CheckpointReader:
    """One checkpoint (file, directory or sharded index), resolved to the files to read.

    ``shapes()`` reads only headers for safetensors (and the index names for sharded
    layouts); a single .bin has no header, so it is loaded once and kept until iterated.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.files, self.weight_map = _resolve(self.path)
        self._bin_cache: dict[str, torch.Tensor] | None = None  # a single .bin, loaded by shapes()

    def __repr__(self) -> str:
        return f"CheckpointReader({str(self.path)!r}, {len(self.files)} file(s))"

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape, in checkpoint order."""
        out: dict[str, tuple[int, ...]] = {}
        for file, names in self._file_names():
            if _is_safetensors(file):
                with _open_safetensors(file) as f:
                    present = set(f.keys())
                    wanted = names if names is not None else list(f.keys())
                    _check_index_names(file, wanted, present)
                    for name in wanted:
                        out[name] = tuple(f.get_slice(name).get_shape())
            else:
                tensors = self._bin(file, keep=len(self.files) == 1)
                wanted = names if names is not None else list(tensors)
                _check_index_names(file, wanted, set(tensors))
                for name in wanted:
                    out[name] = tuple(tensors[name].shape)
        return out

    def names(self) -> list[str]:
        """Tensor names in checkpoint order; from the index alone when there is one."""
        if self.weight_map is not None:
            return list(self.weight_map)
        return list(self.shapes())

    def tensors(self, only: Container[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, cpu tensor)``; with ``only``, other safetensors entries are never read."""
        for file, names in self._file_names():
            if _is_safetensors(file):
                with _open_safetensors(file) as f:
                    wanted = names if names is not None else list(f.keys())
                    _check_index_names(file, wanted, set(f.keys()))
                    for name in wanted:
                        if only is None or name in only:
                            yield name, f.get_tensor(name)
            else:
                tensors = self._bin(file, keep=False)
                wanted = names if names is not None else list(tensors)
                _check_index_names(file, wanted, set(tensors))
                for name in wanted:
                    if only is None or name in only:
                        yield name, tensors[name]
                del tensors

    def _file_names(self) -> Iterator[tuple[Path, list[str] | None]]:
        """Each file with the names the index assigns to it (None: every tensor in the file)."""
        if self.weight_map is None:
            for file in self.files:
                yield file, None
            return
        by_file: dict[Path, list[str]] = {}
        for name, shard in self.weight_map.items():
            by_file.setdefault(shard, []).append(name)
        for file in self.files:
            yield file, by_file[file]

    def _bin(self, file: Path, keep: bool) -> dict[str, torch.Tensor]:
        if self._bin_cache is not None:
            tensors = self._bin_cache
            if not keep:
                self._bin_cache = None  # iterating hands it over; memory is freed afterwards
            return tensors
        tensors = _load_bin(file)
        if keep:
            self._bin_cache = tensors
        return tensors


def iter_checkpoint_tensors(path: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield every ``(name, tensor)`` of a checkpoint, on the CPU, one at a time for safetensors."""
    yield from CheckpointReader(path).tensors()


def checkpoint_tensor_names(path: str | os.PathLike) -> list[str]:
    """Names of a checkpoint's tensors, from headers / the index (a .bin has to be loaded)."""
    return CheckpointReader(path).names()


def _resolve(path: Path) -> tuple[tuple[Path, ...], dict[str, Path] | None]:
    """The files to read and, for sharded layouts, the index's tensor name -> shard path map."""
    if not path.exists():
        raise WeightsError(f"checkpoint path does not exist: {path}")
    if path.is_dir():
        return _resolve(_find_in_dir(path))
    if path.name.endswith(".index.json"):
        return _read_index(path)
    if _is_safetensors(path) or path.suffix in _BIN_SUFFIXES:
        return (path,), None
    raise WeightsError(f"unknown checkpoint file type: {path} (expected .safetensors, .bin/.pt/.pth or *.index.json)")


def _find_in_dir(directory: Path) -> Path:
    if (directory / SAFETENSORS_FILE).is_file():
        return directory / SAFETENSORS_FILE
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) == 1:
        return indexes[0]
    if len(indexes) > 1:
        if (directory / SAFETENSORS_INDEX).is_file():
            return directory / SAFETENSORS_INDEX
        raise WeightsError(
            f"several safetensors indexes in {directory}: {', '.join(p.name for p in indexes)}; pass the one to load"
        )
    for name in (BIN_FILE, BIN_INDEX):
        if (directory / name).is_file():
            return directory / name
    others = sorted(p.name for p in directory.glob("*.safetensors"))
    hint = f" (found {', '.join(others)}; pass the file path to load one)" if others else ""
    raise WeightsError(f"no model.safetensors, *.safetensors.index.json or pytorch_model.bin in {directory}{hint}")


def _read_index(index: Path) -> tuple[tuple[Path, ...], dict[str, Path]]:
    try:
        data = json.loads(index.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WeightsError(f"cannot read checkpoint index {index}: {e}") from e
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise WeightsError(f"checkpoint index {index} has no 'weight_map' of tensor name -> shard file")
    shard_names = list(dict.fromkeys(weight_map.values()))  # first-appearance order, no repeats
    shards = tuple(index.parent / s for s in shard_names)
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise WeightsError(
            f"checkpoint index {index} names shard file(s) missing from {index.parent}: {', '.join(missing)}"
        )
    return shards, {name: index.parent / shard for name, shard in weight_map.items()}


def _check_index_names(file: Path, wanted: list[str], present: set[str]) -> None:
    absent = [n for n in wanted if n not in present]
    if absent:
        shown = ", ".join(absent[:10]) + (f", ... and {len(absent) - 10} more" if len(absent) > 10 else "")
        raise WeightsError(f"the checkpoint index puts tensor(s) in {file} that it does not hold: {shown}")


def _open_safetensors(file: Path):
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise WeightsError(f"cannot read safetensors file {file}: {e}") from e


def _load_bin(file: Path) -> dict[str, torch.Tensor]:
    try:
        # mmap avoids a second in-memory copy; old (non-zip) pickles cannot be mmapped.
        try:
            data = torch.load(file, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError:
            data = torch.load(file, weights_only=True, map_location="cpu")
    except Exception as e:
        raise WeightsError(f"cannot read torch checkpoint {file}: {e}") from e
    if not isinstance(data, dict):
        raise WeightsError(f"torch checkpoint {file} holds a {type(data).__name__}, not a dict of tensors")
    bad = [str(k) for k, v in data.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        shown = ", ".join(bad[:10]) + (f", ... and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise WeightsError(f"torch checkpoint {file} has entries that are not named tensors: {shown}")
    return data
