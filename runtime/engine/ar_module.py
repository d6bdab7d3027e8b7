"""The contract between the AR engine and an autoregressive model component."""
from __future__ import annotations

from typing import ClassVar

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.kv_cache import KVSpec
from mstar.graph.node import EngineKind, NodeSubmodule



class ARModule(NodeSubmodule):
    """An AR component (LLM, talker, predictor). The engine owns batching, KV and sampling.

    ``forward`` gets the step's packed tokens of every sequence in the batch
    (prefill chunks and decode tokens mixed) and calls ``attn(layer, q, k, v, scale)``
    in each attention layer; it returns hidden states, one row per token.
    """

    engine: ClassVar[EngineKind] = "ar"

    def kv_spec(self) -> KVSpec:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def max_positions(self) -> int:
        """Longest sequence (in tokens) the model supports."""
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext) -> torch.Tensor:  # type: ignore[override]
        """input_ids, positions: [T] int64 -> hidden states [T, H]."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [B, H] -> logits [B, V], or [B, K] for only the vocabulary rows ``token_ids`` [K]."""
        raise NotImplementedError

    def allowed_token_ranges(self, num_generated: int) -> list[tuple[int, int]] | None:
        """Constrained decoding: the [lo, hi) id ranges allowed for the next token of a
        sequence that has generated ``num_generated`` tokens; None allows all."""
        return None

    def decode_period(self) -> int:
        """Tokens after which ``allowed_token_ranges`` repeats (1: no period). Sequences in the
        same phase share one restricted LM head per step and end their periods (e.g. audio
        frames) in the same step, so the scheduler starts new ones in the running ones' phase."""
        return 1
