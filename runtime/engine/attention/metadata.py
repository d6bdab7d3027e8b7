"""What one engine step tells the attention backend: which tokens, where their KV lives, which mask."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch


class MaskKind(IntEnum):
    """Which cached keys a query may see (positions are absolute token positions).

    CAUSAL: key_pos <= query_pos.
    PREFIX_BIDIRECTIONAL: causal, plus every position < ``mask_arg`` sees the whole prefix
        [0, mask_arg) (PaliGemma / pi0.5 prefix).
    BLOCK_CAUSAL: frame-wise causal with frames of ``mask_arg`` tokens:
        key_pos // mask_arg <= query_pos // mask_arg (V-JEPA 2-AC predictor).

    Any kind may add bidirectional spans (``SeqAttention.spans``): a query inside span [a, b) also
    sees every key of [a, b) (an image's rows seeing each other inside an otherwise causal text).
    """

    CAUSAL = 0
    PREFIX_BIDIRECTIONAL = 1
    BLOCK_CAUSAL = 2


@dataclass
class SeqAttention:
    """One sequence of a packed batch.

    The step's new tokens of this sequence are rows ``[query_start, query_start + query_len)``
    of the packed q/k/v. After the step the sequence has ``context_len`` cached tokens
    (including the new ones) in ``block_table``; cached token ``i`` has absolute
    position ``first_position + i`` (``first_position`` > 0 after sliding-window eviction
    dropped whole blocks from the front). The new tokens are the last ``query_len`` of them.
    ``spans``: bidirectional [start, end) ranges of absolute positions (sorted, disjoint) that the
    step's queries lie in; a span is never split over steps, so its keys are all in this step.
    """

    query_start: int
    query_len: int
    context_len: int
    block_table: list[int]
    first_position: int = 0
    mask: MaskKind = MaskKind.CAUSAL
    mask_arg: int = 0
    spans: tuple[tuple[int, int], ...] = ()


@dataclass
class AttentionMetadata:
    """Per-step attention plan input, shared by every layer of the step.

    ``slot_mapping[t]`` is the flat cache slot (``block * block_size + offset``) where
    packed token ``t``'s K/V is written.
    """

    seqs: list[SeqAttention]
    slot_mapping: torch.Tensor  # [T] int64

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.numel())
