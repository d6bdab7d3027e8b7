"""Sharding a loaded model for tensor parallelism (Megatron-style), model-agnostic.

- column-parallel Linear: each rank keeps a slice of the output features (rows of the
  weight); the output stays split (e.g. local attention heads, local MLP features).
- row-parallel Linear: each rank keeps the matching slice of the input features
  (columns) and the partial outputs are summed with an all-reduce.
- vocab-parallel embedding: each rank holds a vocabulary slice, looks up the ids
  inside it (zeros elsewhere), and an all-reduce assembles the rows.
- parallel LM head: each rank computes the logits of its vocabulary slice; the
  slices are gathered (full vocabulary) or summed (a restricted set of ids).

Weights are loaded whole and sliced afterwards (``column_parallel`` etc. copy the slice,
so the full tensor can be freed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.layers.fp16_weights import Fp16Linear
from mstar.layers.linear_packing import linear_rows
from mstar.layers.vocab_constraint import contiguous_runs
from mstar.layers.weight_only import WeightOnlyLinear
from mstar.parallel.group import TPGroup


def check_divisible(tp: TPGroup | int, **fields: int) -> None:
    """Raises ValueError naming the first field not divisible by the group size."""
    size = tp if isinstance(tp, int) else tp.size
    for name, value in fields.items():
        if value % size:
            raise ValueError(f"tensor parallel: {name} = {value} is not divisible by tp_size = {size}")


def shard_range(total: int, tp: TPGroup) -> tuple[int, int]:
    """[lo, hi) of this rank's equal slice of ``total`` items."""
    per = total // tp.size
    return tp.rank * per, (tp.rank + 1) * per


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone(), requires_grad=False)


def column_parallel(linear: nn.Linear, tp: TPGroup, name: str = "out_features") -> nn.Linear:
    """This rank's output slice of ``linear`` (a plain Linear: no communication needed)."""
    check_divisible(tp, **{name: linear.out_features})
    lo, hi = shard_range(linear.out_features, tp)
    out = nn.Linear(linear.in_features, hi - lo, bias=linear.bias is not None, device="meta", dtype=linear.weight.dtype)
    out.weight = _param(linear.weight[lo:hi])
    if linear.bias is not None:
        out.bias = _param(linear.bias[lo:hi])
    return out


class RowParallelLinear(nn.Module):
    """Input-feature slice of a Linear; ``forward`` all-reduces the partial products."""

    def __init__(self, linear: nn.Linear, tp: TPGroup, name: str = "in_features") -> None:
        super().__init__()
        check_divisible(tp, **{name: linear.in_features})
        lo, hi = shard_range(linear.in_features, tp)
        self.tp = tp
        self.in_features, self.out_features = hi - lo, linear.out_features
        self.weight = _param(linear.weight[:, lo:hi])
        self.bias = None if linear.bias is None else _param(linear.bias)  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_reduce_(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


def vocab_slice(weight: torch.Tensor, tp: TPGroup, name: str = "vocab_size") -> tuple[nn.Parameter, int]:
    """(this rank's rows of a [V, H] embedding / head weight, index of its first row)."""
    check_divisible(tp, **{name: weight.shape[0]})
    lo, hi = shard_range(weight.shape[0], tp)
    return _param(weight[lo:hi]), lo


class VocabParallelEmbedding(nn.Module):
    def __init__(self, weight: nn.Parameter, vocab_start: int, vocab_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = weight
        self.vocab_start, self.vocab_size, self.tp = vocab_start, vocab_size, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(torch.where(inside, local, 0), self.weight)
        rows = rows * inside.unsqueeze(-1).to(rows.dtype)
        return self.tp.all_reduce_(rows)


def restricted_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor | nn.Linear | WeightOnlyLinear | Fp16Linear,
    token_ids: torch.Tensor | None,
) -> torch.Tensor:
    """hidden [B, H] @ weight[token_ids].T (+ bias[token_ids] of a head module): [B, K] (all rows when
    ``token_ids`` is None). Sorted ids with few runs read the rows as views (no gather copy). ``weight``
    may be the head module itself: a weight-only quantized or fp16 head is read without dequantizing it."""
    if isinstance(weight, WeightOnlyLinear | Fp16Linear):
        return _quantized_logits(hidden, weight, token_ids)
    if isinstance(weight, nn.Linear):
        logits = restricted_logits(hidden, weight.weight, token_ids)
        if weight.bias is None:
            return logits
        bias = weight.bias if token_ids is None else weight.bias.index_select(0, token_ids.to(weight.bias.device))
        return logits + bias.to(logits.dtype)
    hidden = hidden.to(weight.dtype)
    if token_ids is None:
        return F.linear(hidden, weight)
    runs = contiguous_runs(token_ids)
    if runs is None:  # scattered ids: gather the rows
        return F.linear(hidden, weight.index_select(0, token_ids.to(weight.device)))
    if not runs:
        return hidden.new_zeros(hidden.shape[0], 0)
    return torch.cat([linear_rows(hidden, weight, lo, hi) for lo, hi in runs], dim=-1)


def _quantized_logits(
    hidden: torch.Tensor, head: WeightOnlyLinear | Fp16Linear, token_ids: torch.Tensor | None
) -> torch.Tensor:
    if token_ids is None:
        return head(hidden)
    runs = contiguous_runs(token_ids)
    if runs is None:
        return head.gather(hidden, token_ids)
    if not runs:
        return hidden.new_zeros(hidden.shape[0], 0)
    return head.row_runs(hidden, runs)


class ParallelLMHead(nn.Module):
    """Each rank holds vocabulary rows [vocab_start, vocab_start + V/size) of the head."""

    def __init__(self, weight: nn.Parameter, vocab_start: int, vocab_size: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = weight
        self.vocab_start, self.vocab_size, self.tp = vocab_start, vocab_size, tp

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, V], or [B, K] for ``token_ids`` [K] (any order): each rank fills the columns
        of the ids in its slice, zeros elsewhere, and a sum assembles them exactly."""
        if token_ids is None:
            return self.tp.all_gather(restricted_logits(hidden, self.weight, None))
        ids = token_ids.to(self.weight.device)
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = hidden.new_zeros(hidden.shape[0], ids.numel(), dtype=self.weight.dtype)
        if bool(inside.all()):
            out = restricted_logits(hidden, self.weight, local)
        elif bool(inside.any()):
            out[:, inside] = restricted_logits(hidden, self.weight, local[inside])
        return self.tp.all_reduce_(out)
