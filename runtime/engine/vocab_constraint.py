"""Constrained decoding over a restricted vocabulary.

A model may allow only some token ranges at each step (Orpheus: one SNAC slot's
4096 codes). The engine then computes logits for the union of the batch's allowed
ids only (a fraction of the LM head) and masks each row to its own ranges.
"""
from __future__ import annotations

from functools import lru_cache

import torch

TokenRanges = list[tuple[int, int]]


def union_vocab(per_row: list[TokenRanges | None], device: torch.device) -> torch.Tensor | None:
    """Sorted unique ids allowed in any row, or None when some row allows everything."""
    if any(r is None for r in per_row):
        return None
    spans = tuple(sorted({span for ranges in per_row for span in ranges}))  # type: ignore[union-attr]
    return _union(spans, str(device))


@lru_cache(maxsize=128)
def _union(spans: tuple[tuple[int, int], ...], device: str) -> torch.Tensor:
    # cached: a constrained model cycles through a few span sets (Orpheus: 7 slots)
    ids = torch.cat([torch.arange(lo, hi) for lo, hi in spans])
    return torch.unique(ids).to(device)


def mask_rows(logits: torch.Tensor, vocab: torch.Tensor | None, per_row: list[TokenRanges | None]) -> torch.Tensor:
    """Sets disallowed columns of each row to -inf (in place) and returns logits."""
    if all(r is None for r in per_row):
        return logits
    allowed = torch.zeros_like(logits, dtype=torch.bool)
    for i, ranges in enumerate(per_row):
        if ranges is None:
            allowed[i] = True
            continue
        for lo, hi in ranges:
            if vocab is None:
                allowed[i, lo:hi] = True
            else:
                a = int(torch.searchsorted(vocab, lo))
                b = int(torch.searchsorted(vocab, hi))
                allowed[i, a:b] = True
    return logits.masked_fill_(~allowed, float("-inf"))


def contiguous_runs(ids: torch.Tensor, max_runs: int = 8) -> list[tuple[int, int]] | None:
    """Sorted ids as [start, end) runs, or None if there are more than ``max_runs`` of them.

    Lets an LM head read its restricted rows as views (no gather copy per step).
    """
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
