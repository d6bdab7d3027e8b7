"""Writing checkpoints as safetensors: one ``model.safetensors`` or HF-style shards plus an index."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from mstar.weights.checkpoint_files import SAFETENSORS_FILE, SAFETENSORS_INDEX, WeightsError

_SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def save_safetensors(
    state_dict: Mapping[str, torch.Tensor],
    directory: str | os.PathLike,
    *,
    max_shard_bytes: int | None = None,
    metadata: dict[str, str] | None = None,
) -> list[Path]:
    """Write ``state_dict`` under ``directory`` and return the files written (shards, then the index).

    One ``model.safetensors`` when everything fits in ``max_shard_bytes`` (or no limit is
    given), else ``model-0000i-of-0000N.safetensors`` shards plus ``model.safetensors.index.json``.
    A tensor larger than the limit gets a shard of its own. Earlier ``model*.safetensors``
    files and index in the directory are removed so a loader never picks up a stale layout.
    ``metadata`` goes into every file's header (with ``format: pt``, which HF expects).
    """
    if max_shard_bytes is not None and max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    tensors = _prepare(state_dict)
    file_meta = {"format": "pt", **(metadata or {})}
    bad_meta = [k for k, v in file_meta.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad_meta:
        raise ValueError(f"safetensors metadata must map str -> str; offending keys: {', '.join(map(str, bad_meta))}")

    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_previous(out_dir)

    shards = _split(tensors, max_shard_bytes)
    if len(shards) == 1:
        path = out_dir / SAFETENSORS_FILE
        _write(shards[0], path, file_meta)
        return [path]

    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        path = out_dir / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _write(shard, path, file_meta)
        written.append(path)
        weight_map.update(dict.fromkeys(shard, path.name))
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {**(metadata or {}), "total_size": total}, "weight_map": weight_map}
    index_path = out_dir / SAFETENSORS_INDEX
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    written.append(index_path)
    return written


def _prepare(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors, none sharing storage (safetensors refuses shared tensors)."""
    bad = [str(k) for k, v in state_dict.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise WeightsError(f"state_dict entries that are not named tensors: {', '.join(bad[:10])}")
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.numel() == 0:
            t = t.clone()  # tied weights or views of one buffer: each entry gets its own copy
        else:
            seen.add(ptr)
        out[name] = t
    return out


def _split(tensors: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    """Greedy, order-preserving split into shards of at most ``max_bytes`` each."""
    if max_bytes is None:
        return [tensors]
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    return shards


def _write(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    # Write then rename, so a crash never leaves a truncated file under the final name.
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def _remove_previous(directory: Path) -> None:
    for path in directory.iterdir():
        if path.name in (SAFETENSORS_FILE, SAFETENSORS_INDEX) or _SHARD_RE.fullmatch(path.name):
            path.unlink()
