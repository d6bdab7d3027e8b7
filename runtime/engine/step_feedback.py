"""Two AR-module extensions of the engine's step: per-row outputs and Loop feedback rows.

**Row outputs** (``ARModule.row_outputs``): a module may leave per-row tensors of a step in
``rows_out`` (e.g. the Thinker's input embeddings and an inner layer's hidden states, which the
Talker reads). They are kept per sequence at their token positions (a recomputed row overwrites
itself) and every computed row goes out with each call's final output, so the last output holds
the whole sequence so far.

**Feedback** (``ARModule.has_feedback``): in a Loop, the next iteration's input is normally the
sampled token's embedding. A module with ``feedback`` computes that row itself from the hidden
state it sampled from and the token (the Talker: the code predictor's 15 codes for the frame, and
the sum of the frame's 16 code embeddings plus the next text row), batched over every sequence of
the step that goes on; the row enters as an embedding row, the extra outputs go out with the token.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mstar.engine.ar_module import ARModule, FeedbackCall
from mstar.engine.sequence import Sequence

CORE_INPUTS = ("input_ids", "embeds", "embed_mask", "rope_positions", "spans", "row_kinds")


def keep_rows(module: ARModule, items) -> None:
    """After a forward: ``module.rows_out`` rows of each scheduled item into its sequence's rows."""
    if not module.row_outputs:
        return
    out: Mapping[str, torch.Tensor] = getattr(module, "rows_out", None) or {}
    offset = 0
    for item in items:
        seq: Sequence = item.seq
        n = item.num_tokens
        if seq.kv_window is not None:  # a sliding window moves token positions under the kept rows
            raise ValueError(f"node {seq.node!r}: row outputs do not support a kv_window yet")
        for name in module.row_outputs:
            rows = out[name][offset : offset + n].detach().to("cpu", torch.float32)
            store = seq.rows.get(name)
            need = item.end
            if store is None or store.shape[0] < need:
                grown = torch.zeros(max(need, 2 * (0 if store is None else store.shape[0])), rows.shape[1])
                if store is not None:
                    grown[: store.shape[0]] = store
                store = seq.rows[name] = grown
            store[item.start : item.end] = rows
        offset += n


def row_outputs(seq: Sequence) -> dict[str, torch.Tensor]:
    """Every computed row of the sequence, per row output."""
    return {name: rows[: seq.num_computed].clone() for name, rows in seq.rows.items()}


def feedback_call(seq: Sequence) -> FeedbackCall:
    """``seq``'s running call as its module's feedback hooks see it."""
    call = seq.call
    assert call is not None and call.msg.sampling is not None
    return FeedbackCall(
        iteration=call.iteration,
        inputs=seq.side_inputs,
        greedy=call.msg.sampling.greedy,
        generator=seq.generator,
        open_inputs=frozenset(seq.open_inputs),
    )


def last_sample(module: ARModule, seq: Sequence) -> bool:
    """Whether ``seq``'s next sample is its Loop call's last: by the call's ``max_iters``, or by the
    module's ``loop_limit`` (asked only of a module that sets one)."""
    call = seq.call
    assert call is not None
    if call.iteration + 1 >= call.max_iters:
        return True
    if type(module).loop_limit is ARModule.loop_limit or call.msg.sampling is None:
        return False
    limit = module.loop_limit(feedback_call(seq))
    return limit is not None and call.iteration + 1 >= limit


def feedback_rows(
    module: ARModule,
    seqs: list[Sequence],
    tokens: list[int],
    hidden: torch.Tensor,
    rows: list[int],
    continuing: list[bool],
) -> dict[tuple[str, str], tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """For the sequences whose Loop goes on: (next input row, extra outputs), by sequence key.
    ``hidden`` is the step's packed rows; ``rows[i]`` the one ``seqs[i]`` sampled from."""
    if not module.has_feedback:
        return {}
    picked = [i for i, c in enumerate(continuing) if c]
    if not picked:
        return {}
    calls = [feedback_call(seqs[i]) for i in picked]
    next_rows, outs = module.feedback(
        hidden[[rows[i] for i in picked]], torch.tensor([tokens[i] for i in picked], device=hidden.device), calls
    )
    return {seqs[i].key: (next_rows[j].detach().to("cpu", torch.float32), outs[j]) for j, i in enumerate(picked)}


def append_embed_row(seq: Sequence, row: torch.Tensor) -> None:
    """The fed-back token's position enters as ``row``."""
    n = len(seq.token_ids) - 1  # the token was just appended
    if seq.embeds is None:
        seq.embeds = torch.zeros(0, row.shape[0])
        seq.embed_mask = torch.zeros(0, dtype=torch.bool)
    short = n - seq.embeds.shape[0]  # tokens that came without rows (they are not embeddings)
    if short > 0:
        seq.embeds = torch.cat([seq.embeds, torch.zeros(short, row.shape[0])])
        seq.embed_mask = torch.cat([seq.embed_mask, torch.zeros(short, dtype=torch.bool)])
    seq.embeds = torch.cat([seq.embeds[:n], row[None]])
    seq.embed_mask = torch.cat([seq.embed_mask[:n], torch.ones(1, dtype=torch.bool)])
