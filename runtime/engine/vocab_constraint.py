"""Constrained decoding over a restricted vocabulary.

A model may allow only some token ranges at each step (Orpheus: one SNAC slot's
4096 codes). The engine then computes logits for the union of the batch's allowed
ids only (a fraction of the LM head) and masks each row to its own ranges.
"""
from __future__ import annotations

import torch

TokenRanges = list[tuple[int, int]]


def union_vocab(per_row: list[TokenRanges | None], device: torch.device) -> torch.Tensor | None:
    """Sorted unique ids allowed in any row, or None when some row allows everything."""
    if any(r is None for r in per_row):
        return None
    spans = sorted({span for ranges in per_row for span in ranges})  # type: ignore[union-attr]
    ids = torch.cat([torch.arange(lo, hi, device=device) for lo, hi in spans])
    return torch.unique(ids)


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
