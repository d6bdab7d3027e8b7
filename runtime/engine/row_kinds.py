"""Row kinds: a per-row integer a module routes on, kept on the sequence like its embedding rows.

A token call may carry an input ``row_kinds``, int64 [T] (one per input token; rows of calls
without it are kind 0). What a kind means is the module's business (e.g. which of two weight sets
computes the row); the engine only keeps it aligned with the tokens, so a recompute after
preemption, a fork and a KV handoff see the same kinds, and packs the step's rows'
kinds as ``row_kinds`` [T_packed] for the module's ``forward``. Only a module that says
``accepts_row_kinds = True`` takes them; a call with row kinds to any other is refused.
"""

from __future__ import annotations

import torch

from mstar.engine.sequence import Sequence


def accepts_row_kinds(module: object) -> bool:
    return bool(getattr(module, "accepts_row_kinds", False))


def call_row_kinds(value: torch.Tensor, count: int, module: object, node: str) -> torch.Tensor:
    """A call's ``row_kinds`` as int64 [count]; ValueError names what is wrong."""
    if not accepts_row_kinds(module):
        raise ValueError(f"node {node!r}: module {type(module).__name__} takes no row_kinds")
    value = torch.as_tensor(value)
    if value.dtype.is_floating_point or value.dtype.is_complex:
        raise ValueError(f"node {node!r}: input 'row_kinds' must be integers, got {value.dtype}")
    if value.dim() > 1 or value.numel() != count:
        raise ValueError(
            f"node {node!r}: input 'row_kinds' must be [{count}] (one per input token), got {tuple(value.shape)}"
        )
    return value.reshape(-1).long().cpu()


def add_row_kinds(seq: Sequence, kinds: torch.Tensor, before: int) -> None:
    """Keeps a call's kinds for its tokens, which follow ``before`` tokens of ``seq``."""
    earlier = seq.row_kinds[:before] if seq.row_kinds is not None else torch.zeros(0, dtype=torch.long)
    if earlier.numel() < before:  # earlier tokens came without kinds
        earlier = torch.cat([earlier, torch.zeros(before - earlier.numel(), dtype=torch.long)])
    seq.row_kinds = torch.cat([earlier, kinds])


def row_kinds_of(seq: Sequence, start: int, end: int) -> torch.Tensor:
    """[end - start] int64: the kinds of tokens start..end-1 of ``seq`` (0 past what was given)."""
    kinds = torch.zeros(end - start, dtype=torch.long)
    if seq.row_kinds is not None:
        part = seq.row_kinds[start:end]
        kinds[: part.numel()] = part
    return kinds


def packed_row_kinds(items) -> torch.Tensor:
    """A step's rows' kinds [T] (``items``: ScheduledSeq, in packing order)."""
    if not items:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([row_kinds_of(item.seq, item.start, item.end) for item in items])
