"""Constrained decoding over a restricted vocabulary.

A model may allow only some token ranges at each step (Orpheus: one SNAC slot's
4096 codes). The engine groups the batch's rows by their allowed ranges and
computes each group's logits for exactly those ids (a fraction of the LM head),
so no row ever sees a token it may not emit.
"""

from __future__ import annotations

from functools import lru_cache

import torch

TokenRanges = list[tuple[int, int]]
MAX_RUNS = 8
# runs of union_vocab's tensors (never changed once made), by id; the entry holds its tensor, so the id
# is not reused: the engine passes one of a few such tensors each step, and finding runs takes tensor ops
_KNOWN_RUNS: dict[int, tuple[torch.Tensor, list[tuple[int, int]] | None]] = {}
_KNOWN_RUNS_KEPT = 256


def union_vocab(per_row: list[TokenRanges | None], device: torch.device) -> torch.Tensor | None:
    """Sorted unique ids allowed in any row, or None when some row allows everything."""
    if any(r is None for r in per_row):
        return None
    spans = tuple(sorted({span for ranges in per_row for span in ranges}))  # type: ignore[union-attr]
    return _union(spans, str(device))


@lru_cache(maxsize=128)
def _union(spans: tuple[tuple[int, int], ...], device: str) -> torch.Tensor:
    # cached: a constrained model cycles through a few span sets (Orpheus: 7 slots)
    ids = torch.unique(torch.cat([torch.arange(lo, hi) for lo, hi in spans])).to(device)
    if len(_KNOWN_RUNS) >= _KNOWN_RUNS_KEPT:  # union tensors evicted from the lru cache: start afresh
        _KNOWN_RUNS.clear()
    _KNOWN_RUNS[id(ids)] = (ids, _find_runs(ids, MAX_RUNS))
    return ids


def contiguous_runs(ids: torch.Tensor, max_runs: int = MAX_RUNS) -> list[tuple[int, int]] | None:
    """Sorted ids as [start, end) runs, or None if there are more than ``max_runs`` of them.

    Lets an LM head read its restricted rows as views (no gather copy per step).
    """
    known = _KNOWN_RUNS.get(id(ids)) if max_runs == MAX_RUNS else None
    if known is not None and known[0] is ids:
        return known[1]
    return _find_runs(ids, max_runs)


def _find_runs(ids: torch.Tensor, max_runs: int) -> list[tuple[int, int]] | None:
    if ids.numel() == 0:
        return []
    breaks = torch.nonzero(ids[1:] != ids[:-1] + 1).flatten()
    if breaks.numel() + 1 > max_runs:
        return None
    starts = [0] + (breaks + 1).tolist()
    ends = (breaks + 1).tolist() + [ids.numel()]
    values = ids.tolist() if ids.numel() <= 16 else None
    runs = []
    for a, b in zip(starts, ends):
        lo = values[a] if values is not None else int(ids[a])
        runs.append((lo, lo + (b - a)))
    return runs
