"""Token sampling: greedy, temperature, top-k, top-p, repetition penalty, per-sequence seed.

Works on a (possibly restricted) vocabulary: column j of the logits is token ``vocab[j]``.
Processor order and semantics follow the common HF convention (penalty, then
temperature, top-k, top-p).
"""

from __future__ import annotations

import torch

from mstar.sampling_params import SamplingParams


def apply_repetition_penalty(row: torch.Tensor, columns: torch.Tensor, penalty: float) -> None:
    if penalty == 1.0 or columns.numel() == 0:
        return
    picked = row[columns]
    row[columns] = torch.where(picked > 0, picked / penalty, picked * penalty)


def filter_top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        remove = cumulative <= (1.0 - top_p)
        remove[-1] = False  # always keep the most likely token
        row = row.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return row


def history_columns(history: list[int], vocab: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Columns of the logits that hold tokens already seen."""
    seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=device)
    if vocab is None or seen.numel() == 0:
        return seen
    pos = torch.searchsorted(vocab, seen).clamp(max=vocab.numel() - 1)
    return pos[vocab[pos] == seen]


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,
        vocab: torch.Tensor | None,
        params: list[SamplingParams],
        histories: list[list[int]],
        generators: list[torch.Generator | None],
    ) -> list[int]:
        """logits [B, K] float32 (already masked) -> one token id per row."""
        plain = all(p.greedy and p.repetition_penalty == 1.0 for p in params)
        if plain:
            cols = logits.argmax(dim=-1)
        else:
            cols = torch.empty(len(params), dtype=torch.long, device=logits.device)
            for i, p in enumerate(params):
                row = logits[i].clone()
                apply_repetition_penalty(row, history_columns(histories[i], vocab, row.device), p.repetition_penalty)
                if p.greedy:
                    cols[i] = row.argmax()
                    continue
                row = filter_top_k_top_p(row / p.temperature, p.top_k, p.top_p)
                # drawn on the CPU: the per-request generator lives there (and a seed gives the same
                # tokens whatever device computed the logits)
                probs = torch.softmax(row, dim=-1).cpu()
                cols[i] = torch.multinomial(probs, 1, generator=generators[i])[0]
        tokens = cols if vocab is None else vocab[cols]
        return tokens.tolist()
