"""Positions a request gives its tokens, for models whose RoPE has several axes (M-RoPE: time, height, width).

An AR node may take an input ``rope_positions`` [axes, n]: the positions of the n tokens of that call.
The engine keeps them with the sequence. Every later token, a decode step or a recompute of one,
continues from the largest position given plus one, on every axis. That is M-RoPE's rule after an
image: the text that follows starts past the image's largest position. A token before the given
ones (an earlier call of the same sequence without positions) sits at its index on every axis.

Each step the model runner packs the rows' positions as ``rope_positions`` [axes, T] beside the
1-D ``positions``. It does so only when a sequence of the step has some: a module then gets both,
and the 1-D positions still index the KV.
"""

from __future__ import annotations

import torch

from mstar.engine.sequence import Sequence


def set_rope_positions(seq: Sequence, given: torch.Tensor, count: int, before: int, node: str) -> None:
    """Keeps a call's ``rope_positions`` [axes, count] for its tokens, which follow ``before`` tokens."""
    given = torch.as_tensor(given)
    if given.dim() != 2 or given.shape[1] != count or given.shape[0] < 1:
        raise ValueError(
            f"node {node!r}: rope_positions must be [axes, {count}] (one column per input token), "
            f"got {tuple(given.shape)}"
        )
    if given.dtype.is_floating_point or given.dtype == torch.bool:
        raise ValueError(f"node {node!r}: rope_positions must be integers, got {given.dtype}")
    if count and int(given.min()) < 0:
        raise ValueError(f"node {node!r}: rope_positions must not be negative")
    earlier = rope_positions_of(seq, 0, before, axes=given.shape[0])
    seq.rope_positions = torch.cat([earlier, given.long().cpu()], dim=1)
    n = seq.rope_positions.shape[1]
    seq.rope_after = int(seq.rope_positions.max()) + 1 - n if n else 0  # once, not on every decode step


def rope_positions_of(seq: Sequence, start: int, end: int, axes: int) -> torch.Tensor:
    """[axes, end - start]: the positions of tokens start..end-1 of ``seq``."""
    given = seq.rope_positions
    if given is None:
        first = seq.table.first_position
        return torch.arange(first + start, first + end).expand(axes, -1)
    if given.shape[0] != axes:
        raise ValueError(f"a step mixes rope_positions of {given.shape[0]} and {axes} axes")
    n = given.shape[1]
    head = given[:, start : min(end, n)]
    lo = max(start, n)
    tail = torch.arange(lo, max(end, lo)) + seq.rope_after  # token j >= n sits at j + rope_after (empty when
    # the range ends inside the given positions)
    return torch.cat([head, tail.expand(axes, -1)], dim=1)


def packed_rope_positions(items) -> torch.Tensor | None:
    """A step's rows' positions [axes, T] (``items``: ScheduledSeq, in packing order), or None when no
    sequence of the step was given any."""
    with_positions = [item.seq.rope_positions for item in items if item.seq.rope_positions is not None]
    if not with_positions:
        return None
    axes = with_positions[0].shape[0]
    return torch.cat([rope_positions_of(item.seq, item.start, item.end, axes) for item in items], dim=1)
