"""After a token step's forward: sample the rows that end a call's input, reply, feed tokens back."""

from __future__ import annotations

import torch

from mstar.engine.engine_core import EngineCore
from mstar.engine.messages import NodeOutput
from mstar.engine.scheduler import ScheduledSeq
from mstar.engine.sequence import ActiveCall, SeqStatus, Sequence
from mstar.engine.step_feedback import append_embed_row, feedback_rows, last_sample, row_outputs
from mstar.layers.vocab_constraint import union_vocab


def finish_step(core: EngineCore, batch: list[ScheduledSeq], hidden: torch.Tensor, last_rows: list[int]) -> None:
    sample_seqs, rows = [], []
    for item, row in zip(batch, last_rows):
        seq = item.seq
        if seq.num_pending > 0 or seq.call is None or seq.flow is not None:
            continue  # a prefill chunk; more to come
        if seq.call.wants_token:
            sample_seqs.append(seq)
            rows.append(row)
        else:
            call, seq.call = seq.call, None
            seq.status = SeqStatus.IDLE
            call.reply(
                NodeOutput(
                    call.msg.call_id,
                    call.msg.request_id,
                    call.iteration,
                    _rows(core, seq),
                    final=True,
                    finish_reason="done",
                )
            )
    if not sample_seqs:
        return
    tokens = _sample(core, sample_seqs, hidden, rows)
    continuing = [_continues(core, seq, token) for seq, token in zip(sample_seqs, tokens)]
    fed = feedback_rows(core.module, sample_seqs, tokens, hidden, rows, continuing)
    for seq, token in zip(sample_seqs, tokens):
        _advance(core, seq, token, fed.get(seq.key))


def _sample(core: EngineCore, seqs: list[Sequence], hidden: torch.Tensor, rows: list[int]) -> list[int]:
    # Rows that allow the same token ranges share one restricted LM head: a union over the
    # batch (Orpheus: up to 7 slots x 4096) would compute and mask ~7x the logits needed.
    module = core.module
    groups: dict[object, list[int]] = {}
    ranges = [module.allowed_token_ranges(s.num_generated) for s in seqs]
    for i, r in enumerate(ranges):
        groups.setdefault(None if r is None else tuple(r), []).append(i)
    tokens: list[int] = [0] * len(seqs)
    for members in groups.values():
        group = [seqs[i] for i in members]
        group_rows = [rows[i] for i in members]
        vocab = union_vocab([ranges[i] for i in members], hidden.device)
        if core.tp_leader is not None:  # followers take part in the sharded LM head
            core.tp_leader.logits_plan(group_rows, vocab)
        # every row of the group allows exactly ``vocab``: nothing to mask
        # every row of the step, in order: the rows themselves (the gather would copy them unchanged)
        every_row = hidden.is_contiguous() and group_rows == list(range(hidden.shape[0]))
        rows_in = hidden if every_row else hidden[group_rows]
        logits = module.compute_logits(rows_in, vocab).float()
        picked = core.sampler.sample(
            logits,
            vocab,
            [s.call.msg.sampling for s in group],
            [s.history for s in group],
            [s.generator for s in group],
        )
        for i, token in zip(members, picked):
            tokens[i] = token
    return tokens


def _continues(core: EngineCore, seq: Sequence, token: int) -> bool:
    """Whether the call's Loop feeds ``token`` back for another iteration."""
    call = seq.call
    assert call is not None
    if call.msg.loop is None or token in call.msg.loop.stop_values or last_sample(core.module, seq):
        return False
    return seq.kv_window is not None or seq.table.first_position + len(seq.token_ids) + 1 < core.module.max_positions


def _rows(core: EngineCore, seq: Sequence, outputs: dict | None = None, call: ActiveCall | None = None) -> dict:
    """``outputs`` plus the sequence's row outputs (every computed row), as tensor handles; for a
    call that streams its step rows, only the rows since its last output (``step_<name>``)."""
    outputs = dict(outputs or {})
    if call is not None and call.msg.step_rows:
        return _step_rows(core, seq, call, outputs)
    for name, rows in row_outputs(seq).items():
        outputs[name] = core.store.put(rows, owner=seq.request_id)
    return outputs


def _step_rows(core: EngineCore, seq: Sequence, call: ActiveCall, outputs: dict) -> dict:
    end = seq.num_computed
    if end > call.rows_sent:
        for name, rows in seq.rows.items():
            outputs[f"step_{name}"] = core.store.put(rows[call.rows_sent : end].clone(), owner=seq.request_id)
        call.rows_sent = end
    return outputs


def _advance(core: EngineCore, seq: Sequence, token: int, fed: tuple[torch.Tensor, dict] | None = None) -> None:
    call = seq.call
    assert call is not None
    msg, iteration = call.msg, call.iteration
    continues = _continues(core, seq, token)
    call.iteration += 1
    if msg.loop is not None and token in msg.loop.stop_values:
        seq.call, seq.status = None, SeqStatus.IDLE
        call.reply(
            NodeOutput(
                msg.call_id, msg.request_id, iteration, _rows(core, seq, call=call), final=True, finish_reason="stop"
            )
        )
        return
    seq.num_generated += 1
    seq.history.append(token)
    outputs = {"token": core.store.put(torch.tensor(token, dtype=torch.long), owner=msg.request_id)}
    last = not continues
    if last:
        seq.call, seq.status = None, SeqStatus.IDLE
        outputs = _rows(core, seq, outputs, call)
    else:
        if msg.step_rows:
            _step_rows(core, seq, call, outputs)
        seq.token_ids.append(token)  # loop feedback: next iteration's input
        if fed is not None:  # ... as the row the module computed for it
            row, extra = fed
            append_embed_row(seq, row)
            for name, value in extra.items():
                outputs[name] = core.store.put(value, owner=msg.request_id)
    reason = ("length" if msg.loop is not None else "done") if last else None
    call.reply(NodeOutput(msg.call_id, msg.request_id, iteration, outputs, final=last, finish_reason=reason))
