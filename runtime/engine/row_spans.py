"""Bidirectional spans: rows of a token call that see each other, kept on the sequence.

A token call may carry an input ``spans``, int64 [k, 2]: [start, end) ranges of the call's own
rows (0 = its first input token), sorted, disjoint and non-empty. A row inside a span sees every
row of that span, besides the causal view of everything before it (an image's rows inside an
otherwise causal text). The sequence keeps them as absolute positions (first_position + token
index), so a recompute after preemption, a copy-on-write fork and a KV handoff see the same mask.
The rows of a span must be computed in one step (a row sees later rows of its span), so the
scheduler never splits a span over prefill chunks (:func:`unsplit_chunk`).
"""

from __future__ import annotations

import torch

from mstar.engine.sequence import Sequence


def call_spans(value: torch.Tensor, count: int, node: str) -> list[tuple[int, int]]:
    """The call-local spans of input ``spans`` for a call of ``count`` rows; ValueError names what is wrong."""
    value = torch.as_tensor(value)
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex:
        raise ValueError(f"node {node!r}: input 'spans' must be integers, got {value.dtype}")
    if value.numel() == 0:
        return []
    if value.dim() != 2 or value.shape[1] != 2:
        raise ValueError(f"node {node!r}: input 'spans' must be [k, 2] ([start, end) rows), got {tuple(value.shape)}")
    spans = [(int(a), int(b)) for a, b in value.tolist()]
    for i, (start, end) in enumerate(spans):
        if not 0 <= start < end <= count:
            raise ValueError(
                f"node {node!r}: input 'spans' row {i} is [{start}, {end}), outside the call's {count} rows "
                f"(each span needs 0 <= start < end <= {count})"
            )
        if i and start < spans[i - 1][1]:
            raise ValueError(
                f"node {node!r}: input 'spans' must be sorted and disjoint, but row {i} [{start}, {end}) "
                f"starts before row {i - 1} ends ({spans[i - 1][1]})"
            )
    return spans


def add_spans(seq: Sequence, spans: list[tuple[int, int]], before: int) -> None:
    """Keeps a call's spans (rows after ``before`` tokens) on ``seq`` in absolute positions."""
    offset = seq.table.first_position + before
    seq.spans.extend((offset + start, offset + end) for start, end in spans)


def spans_in(seq: Sequence, start: int, end: int) -> tuple[tuple[int, int], ...]:
    """The spans (absolute) that hold a token of ``seq``'s range [start, end): all a step's mask needs,
    as an earlier span is seen causally anyway."""
    if not seq.spans:
        return ()
    first = seq.table.first_position
    lo, hi = first + start, first + end
    return tuple(span for span in seq.spans if span[0] < hi and span[1] > lo)


def unsplit_chunk(seq: Sequence, start: int, n: int, floor: int = 0) -> int:
    """How many tokens a chunk of ``n`` from token ``start`` may compute without cutting a span: fewer,
    ending where the cut span starts (but not below ``floor``), or more, to the end of a span that
    the chunk cannot leave out."""
    if not seq.spans or n <= 0:
        return n
    first = seq.table.first_position
    end = first + start + n
    for span_start, span_end in seq.spans:
        if span_start < end < span_end:
            keep = span_start - first - start
            return keep if keep >= max(floor, 1) else span_end - first - start
    return n
