"""Token sampling: greedy, temperature, top-k, top-p, repetition penalty, per-sequence seed.

Works on a (possibly restricted) vocabulary: column j of the logits is token ``vocab[j]``.
Processor order and semantics follow the common HF convention (penalty, then
temperature, top-k, top-p).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from mstar.sampling_params import SamplingParams


def apply_repetition_penalty(row: torch.Tensor, columns: torch.Tensor, penalty: float) -> None:
    if penalty == 1.0 or columns.numel() == 0:
        return
    picked = row[columns]
    row[columns] = torch.where(picked > 0, picked / penalty, picked * penalty)


# Top-p looks for its nucleus among this many most likely tokens first (a partial sort), and sorts
# a row whole only where they hold less than top_p of its mass: a sort of a [4, 4097] batch took
# 0.9 ms on CPU (one row: 0.05 ms), a top-64 of it 0.04 ms.
NUCLEUS_CANDIDATES = 64


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k, then top-p, over the last axis: one row [K] or a batch of rows [B, K] (each row
    independently); the tokens dropped become -inf."""
    if 0 < top_k < row.shape[-1]:
        kth = torch.topk(row, top_k).values[..., -1:]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(row, dim=-1, dtype=torch.float64)
        row = row.masked_fill(~nucleus(probs.reshape(-1, row.shape[-1]), top_p).view(row.shape), float("-inf"))
    return row


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The columns top-p keeps in each row of ``probs`` [B, K], as a bool mask [B, K]: the smallest set
    of most likely tokens whose probability reaches ``top_p`` (a token stays when the tokens more
    likely than it hold less than ``top_p``; the most likely always stays)."""
    width = probs.shape[-1]
    keep, reached = _kept(*torch.topk(probs, min(NUCLEUS_CANDIDATES, width)), top_p, width)
    if width > NUCLEUS_CANDIDATES:
        for r in torch.nonzero(~reached).flatten().tolist():  # a wider nucleus: this row sorted whole
            keep[r], _ = _kept(*torch.sort(probs[r], descending=True), top_p, width)
    return keep


def _kept(top: torch.Tensor, order: torch.Tensor, top_p: float, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From the most likely tokens (``top`` descending, their columns ``order``): the mask of those
    kept, and whether they reach ``top_p`` (else the nucleus may go on past them)."""
    mass = top.cumsum(-1)
    chosen = (mass - top) < top_p  # the mass of the more likely tokens
    chosen[..., 0] = True
    mask = torch.zeros(*top.shape[:-1], width, dtype=torch.bool, device=top.device).scatter_(-1, order, chosen)
    return mask, mass[..., -1] >= top_p


def check_samplable(rows: torch.Tensor) -> None:
    """Raises ValueError naming the rows of logits [B, K] that hold NaN or +inf, or no finite logit:
    their probabilities are not a distribution (top-p would keep an arbitrary token of such a row)."""
    bad = ~torch.isfinite(rows.amax(dim=-1))  # amax keeps a NaN; +inf, or -inf when all are masked
    if bool(bad.any()):
        raise ValueError(
            f"cannot sample rows {torch.nonzero(bad).flatten().tolist()}: NaN or +inf logits, or every token masked"
        )


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """One column per row of ``probs`` [B, K] (CPU, rows summing to about 1), column j with probability
    ``probs[j]``: by inverse CDF, one uniform from each row's own generator (None: torch's global one).

    torch.multinomial took 0.1-0.14 ms a row over 4097 columns (it draws an exponential per column
    without replacement); this is one uniform and a search. A zero-probability column is never drawn.
    A row that is not a distribution (NaN logits, or every token masked) raises ValueError.
    """
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    bad = ~(torch.isfinite(total) & (total > 0)).squeeze(1)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise ValueError(f"cannot sample rows {rows}: their probabilities are not finite or sum to 0 (NaN logits?)")
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators]).unsqueeze(1)
    # u < 1 so u * total < total (the rounding of the product never reaches it): some column's
    # cumulative mass exceeds the target, and the first one that does has a nonzero probability
    return torch.searchsorted(cdf, u * total, right=True).squeeze(1).tolist()


def history_columns(history: list[int], vocab: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Columns of the logits that hold tokens already seen."""
    seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=device)
    if vocab is None or seen.numel() == 0:
        return seen
    pos = torch.searchsorted(vocab, seen).clamp(max=vocab.numel() - 1)
    return pos[vocab[pos] == seen]


class Sampler:
    """One call samples a step's rows: argmax for an all-greedy batch; otherwise rows sharing their
    sampling settings go through temperature, top-k and top-p together, and only the repetition
    penalty (each row's own history) and the draw (each row's own generator) are per row."""

    def __init__(self) -> None:
        self._vocabs = VocabColumns()

    def sample(
        self,
        logits: torch.Tensor,
        vocab: torch.Tensor | None,
        params: list[SamplingParams],
        histories: list[list[int]],
        generators: list[torch.Generator | None],
    ) -> list[int]:
        """logits [B, K] float32 (already masked) -> one token id per row."""
        if all(p.greedy and p.repetition_penalty == 1.0 for p in params):
            cols = logits.argmax(dim=-1).tolist()
        else:
            cols = [0] * len(params)
            groups: dict[tuple[float, int, float, float], list[int]] = {}
            for i, p in enumerate(params):
                groups.setdefault((p.temperature, p.top_k, p.top_p, p.repetition_penalty), []).append(i)
            for (temperature, top_k, top_p, penalty), members in groups.items():
                picked = self._sample_group(
                    logits, vocab, members, temperature, top_k, top_p, penalty, histories, generators
                )
                for i, col in zip(members, picked):
                    cols[i] = col
        return cols if vocab is None else self._vocabs.ids(vocab, cols)

    def _sample_group(
        self,
        logits: torch.Tensor,
        vocab: torch.Tensor | None,
        members: list[int],
        temperature: float,
        top_k: int,
        top_p: float,
        penalty: float,
        histories: list[list[int]],
        generators: list[torch.Generator | None],
    ) -> list[int]:
        # a copy of the group's rows: the caller's logits stay as they were
        rows = logits.clone() if len(members) == logits.shape[0] else logits[members]
        if penalty != 1.0:
            for j, i in enumerate(members):
                columns = self._vocabs.columns(histories[i], vocab, rows.device)
                apply_repetition_penalty(rows[j], columns, penalty)
        if temperature == 0.0:
            return rows.argmax(dim=-1).tolist()
        check_samplable(rows)
        rows = filter_top_k_top_p(rows / temperature, top_k, top_p)
        # drawn on the CPU, each row from its own uniform: each request's generator lives there (and a
        # seed gives the same tokens whatever device computed the logits, whoever shares the batch)
        probs = torch.softmax(rows, dim=-1).cpu()
        return draw(probs, [generators[i] for i in members])


@dataclass
class _SeenColumns:
    """The columns of one vocabulary that one history's first ``consumed`` tokens fall in."""

    history: list[int]
    vocab: torch.Tensor
    consumed: int = 0
    columns: set[int] = field(default_factory=set)


class VocabColumns:
    """Column <-> token id of restricted vocabularies, kept per vocabulary tensor (the engine reuses a
    few: mstar.layers.vocab_constraint caches them), so a step converts ids in Python, not with
    tensor ops; and the columns a history has seen, kept per history and vocabulary and brought up to
    date with the tokens appended since (a sequence's history only grows: the engine appends to it,
    a fork or a handoff copies it), so a step reads only its new tokens.

    Histories are evicted least recently used first, each with all its vocabularies: Orpheus cycles 7
    slot vocabularies per sequence, so a cap over (history, vocabulary) pairs cleared at once rebuilt
    nearly every entry each step above ~146 sequences; a finished sequence's history ages out."""

    def __init__(self, max_kept: int = 64, max_histories: int = 1024) -> None:
        self._kept: dict[int, tuple[torch.Tensor, list[int], dict[int, int]]] = {}
        self._max_kept = max_kept
        # id(history) -> (history, id(vocab) -> its columns); ids are not reused while an entry holds its objects
        self._seen: OrderedDict[int, tuple[list[int], dict[int, _SeenColumns]]] = OrderedDict()
        self._max_histories = max_histories

    def _entry(self, vocab: torch.Tensor) -> tuple[torch.Tensor, list[int], dict[int, int]]:
        entry = self._kept.get(id(vocab))
        if entry is None or entry[0] is not vocab:  # the entry holds its tensor: its id is not reused
            if len(self._kept) >= self._max_kept:
                self._kept.clear()
            ids = vocab.tolist()
            entry = self._kept[id(vocab)] = (vocab, ids, {token: col for col, token in enumerate(ids)})
        return entry

    def ids(self, vocab: torch.Tensor, cols: list[int]) -> list[int]:
        ids = self._entry(vocab)[1]
        return [ids[c] for c in cols]

    def columns(self, history: list[int], vocab: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        """Columns of the logits that hold tokens already seen (as :func:`history_columns`)."""
        if vocab is None:
            return history_columns(history, None, device)
        per_vocab = self._of_history(history)
        seen = per_vocab.get(id(vocab))
        # entries hold their tensor (ids not reused); a shorter history is another one
        if seen is None or seen.vocab is not vocab or seen.consumed > len(history):
            if seen is None and len(per_vocab) >= self._max_kept:
                per_vocab.clear()  # a history read through ever new vocabulary tensors
            seen = per_vocab[id(vocab)] = _SeenColumns(history, vocab)
        col_of = self._entry(vocab)[2]
        for token in history[seen.consumed :]:
            col = col_of.get(token)
            if col is not None:
                seen.columns.add(col)
        seen.consumed = len(history)
        return torch.tensor(sorted(seen.columns), dtype=torch.long, device=device)

    def _of_history(self, history: list[int]) -> dict[int, _SeenColumns]:
        """``history``'s columns per vocabulary, made the most recently used (least recent evicted)."""
        entry = self._seen.get(id(history))
        if entry is not None and entry[0] is history:
            self._seen.move_to_end(id(history))
            return entry[1]
        self._seen.pop(id(history), None)  # another list that had the same id
        if len(self._seen) >= self._max_histories:
            self._seen.popitem(last=False)
        self._seen[id(history)] = (history, {})
        return self._seen[id(history)][1]
