"""The contract between the AR engine and an autoregressive model component."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.kv_cache import KVSpec
from mstar.graph.node import EngineKind, NodeSubmodule


@dataclass(frozen=True)
class FeedbackCall:
    """One sequence's step, as a module's :meth:`ARModule.feedback` sees it."""

    iteration: int  # the Loop iteration whose token was just sampled (0: the call's first)
    inputs: Mapping[str, torch.Tensor]  # the sequence's side inputs (its calls' inputs other than ids / embeds)
    greedy: bool  # the call samples greedily
    generator: torch.Generator | None  # the sequence's seeded generator
    open_inputs: frozenset[str] = frozenset()  # side inputs whose rows are still arriving (FeedInput)


class ARModule(NodeSubmodule):
    """An AR component (LLM, talker, predictor). The engine owns batching, KV and sampling.

    ``forward`` gets the step's packed tokens of every sequence in the batch
    (prefill chunks and decode tokens mixed) and calls ``attn(layer, q, k, v, scale)``
    in each attention layer; it returns hidden states, one row per token. Keyword extras, when
    they apply: ``embeds`` [T, W] + ``embed_mask`` [T] (rows given as embeddings),
    ``rope_positions`` [axes, T] (``accepts_rope_positions``), ``row_kinds`` [T] int64
    (``accepts_row_kinds``: mstar.engine.row_kinds), ``need_hidden`` (``accepts_need_hidden``),
    ``hidden_rows`` [K] int64 (``accepts_hidden_rows``: the engine reads only these rows; return [K, H],
    their hidden states in that order).
    A call's input ``spans`` (mstar.engine.row_spans) changes only the attention mask.

    A flow view (``LoopMode.FLOW``) runs the module's ``flow_velocity``: with the fixed contract
    (``action_horizon``, ``action_dim``) or, for a module with ``flow_plan``, the planned one with
    guidance branches (``mstar.engine.flow_plan.FlowModule``).
    """

    engine: ClassVar[EngineKind] = "ar"
    # Per-row tensors ``forward`` leaves in ``self.rows_out`` ({name: [T, ...]}, T the step's packed rows):
    # the engine keeps them per sequence and emits every computed row with each call's final output.
    row_outputs: ClassVar[tuple[str, ...]] = ()
    # Whether a call's input tokens count for the repetition penalty (False: only generated tokens do,
    # as for a model whose prompt is embeddings with placeholder ids).
    prompt_in_history: ClassVar[bool] = True
    # A module with ``feedback`` feeds a Loop's next iteration an embedding row it computes from the
    # sampled token, not the token's own embedding (mstar.engine.step_feedback).
    has_feedback: ClassVar[bool] = False
    # A module that routes rows by kind takes ``row_kinds`` [T] in ``forward`` (mstar.engine.row_kinds);
    # a call carrying row kinds to any other module is refused.
    accepts_row_kinds: ClassVar[bool] = False

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

    def feedback(
        self, hidden: torch.Tensor, tokens: torch.Tensor, calls: list[FeedbackCall]
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Loop feedback (``has_feedback``): hidden [B, H] of the rows just sampled, their tokens [B] ->
        (the next iteration's input rows [B, H], per sequence extra outputs of this iteration)."""
        raise NotImplementedError

    def feedback_ready(self, call: FeedbackCall) -> bool:
        """Whether ``feedback`` for ``call`` (its next sample) can run with the rows of its side inputs
        that have arrived; False holds the sequence back until more arrive or their stream ends."""
        return True

    def loop_limit(self, call: FeedbackCall) -> int | None:
        """The most iterations ``call``'s Loop may run, from its side inputs so far; None: only the call's
        own ``max_iters`` (the lower of the two ends it, finish reason ``length``). Asked before each sample."""
        return None

    def allowed_token_ranges(self, num_generated: int) -> list[tuple[int, int]] | None:
        """Constrained decoding: the [lo, hi) id ranges allowed for the next token of a
        sequence that has generated ``num_generated`` tokens; None allows all."""
        return None

    def decode_period(self) -> int:
        """Tokens after which ``allowed_token_ranges`` repeats (1: no period). Sequences in the
        same phase share one restricted LM head per step and end their periods (e.g. audio
        frames) in the same step, so the scheduler starts new ones in the running ones' phase."""
        return 1
