"""Admitting a token call: its checks, and its inputs joining the (new or continued) sequence."""

from __future__ import annotations

import math
import time

import torch

from mstar.engine.engine_core import EngineCore
from mstar.engine.engine_inbox import Reply
from mstar.engine.fed_inputs import as_rows
from mstar.engine.kv_handoff import import_sequence
from mstar.engine.loop_contract import CallRefused
from mstar.engine.messages import ExecuteNode
from mstar.engine.rope_positions import set_rope_positions
from mstar.engine.row_kinds import add_row_kinds, call_row_kinds
from mstar.engine.row_spans import add_spans, call_spans
from mstar.engine.sequence import ActiveCall, SeqStatus, Sequence
from mstar.engine.step_feedback import CORE_INPUTS


def admit_token_call(core: EngineCore, msg: ExecuteNode, reply: Reply) -> None:
    """Queues ``msg``'s tokens on its sequence (the session's, a KV import, or a new one)."""
    owner = msg.session_id or msg.request_id
    seq = core.scheduler.seqs.get((owner, msg.node))
    if seq is None and msg.kv_import is not None:
        seq = import_sequence(core, msg)
    ref = msg.inputs.get("input_ids")
    ids = [] if ref is None else core.store.resolve(ref).reshape(-1).tolist()
    _check_fits(core, msg, seq, ids)
    rows = _row_inputs(core, msg, len(ids))  # checked before anything joins a sequence
    if seq is None:
        seq = core.new_sequence(msg, owner)
    seq.request_id = msg.request_id
    context_before = len(seq.token_ids)
    _take_inputs(core, seq, msg, ids, context_before)
    spans, kinds = rows
    add_spans(seq, spans, context_before)
    if kinds is not None:
        add_row_kinds(seq, kinds, context_before)
    seq.mask, seq.mask_arg, seq.kv_window = msg.mask, msg.mask_arg, msg.kv_window
    seq.call = ActiveCall(msg, reply, context_before=context_before, rows_sent=context_before)
    seq.status = SeqStatus.RUNNING if seq.table.blocks else SeqStatus.WAITING
    if msg.session_id is not None:
        seq.arrival = time.monotonic()  # a session's new message queues behind earlier requests


def _check_fits(core: EngineCore, msg: ExecuteNode, seq: Sequence | None, ids: list[int]) -> None:
    """CallRefused unless ``ids`` are in the vocabulary and the call fits the context and the KV pool."""
    module, blocks = core.module, core.blocks
    vocab = module.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise CallRefused(f"node {msg.node!r}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    known = 0 if seq is None else len(seq.token_ids)
    if known + len(ids) == 0 or (seq is not None and seq.num_pending + len(ids) == 0 and msg.sampling is not None):
        raise CallRefused(f"node {msg.node!r}: call has no input tokens")
    loop_iters = 1 if msg.loop is None else (msg.loop.max_iters or 0)
    first = 0 if seq is None else seq.table.first_position
    need = first + known + len(ids) + loop_iters
    if msg.kv_window is None and need > module.max_positions:
        raise CallRefused(
            f"node {msg.node!r}: request needs {need} positions ({known + len(ids)} tokens in context "
            f"+ {loop_iters} to generate), over the model's context limit of {module.max_positions}"
        )
    window = msg.kv_window if msg.kv_window is not None else known + len(ids) + loop_iters
    blocks_needed = math.ceil(min(window + blocks.block_size, known + len(ids) + loop_iters) / blocks.block_size)
    if blocks_needed > blocks.num_blocks:
        raise CallRefused(
            f"node {msg.node!r}: request needs {blocks_needed} KV blocks, the pool has {blocks.num_blocks}"
        )


def _row_inputs(core: EngineCore, msg: ExecuteNode, count: int) -> tuple[list[tuple[int, int]], torch.Tensor | None]:
    """The call's bidirectional ``spans`` and ``row_kinds`` (mstar.engine.row_spans, row_kinds), checked."""
    spans = call_spans(core.store.resolve(msg.inputs["spans"]), count, msg.node) if "spans" in msg.inputs else []
    kinds = None
    if "row_kinds" in msg.inputs:
        kinds = call_row_kinds(core.store.resolve(msg.inputs["row_kinds"]), count, core.module, msg.node)
    return spans, kinds


def _take_inputs(core: EngineCore, seq: Sequence, msg: ExecuteNode, ids: list[int], context_before: int) -> None:
    """The call's tokens, embeddings, rope positions and side inputs join ``seq``."""
    module = core.module
    if "embeds" in msg.inputs:
        _append_embeds(core, seq, msg, len(ids), context_before)
    if "rope_positions" in msg.inputs:
        if not getattr(module, "accepts_rope_positions", False):
            raise ValueError(f"node {msg.node!r}: this model takes no rope_positions")
        if msg.kv_window is not None:  # eviction would shift token indices under the kept positions
            raise ValueError(f"node {msg.node!r}: rope_positions do not support a kv_window yet")
        set_rope_positions(seq, core.store.resolve(msg.inputs["rope_positions"]), len(ids), context_before, msg.node)
    seq.token_ids.extend(ids)
    if module.prompt_in_history:
        seq.history.extend(ids)
    unknown = [p for p in msg.fed_inputs if p in CORE_INPUTS]
    if unknown or (msg.fed_inputs and (msg.loop is None or not module.has_feedback)):
        raise ValueError(
            f"node {msg.node!r}: fed inputs {list(msg.fed_inputs)} need a Loop call of a module with "
            f"feedback, and cannot be {list(CORE_INPUTS)}"
        )
    for name, ref in msg.inputs.items():  # a feedback hook reads them on every later iteration
        if name not in CORE_INPUTS and module.has_feedback:
            value = core.store.resolve(ref)
            seq.side_inputs[name] = as_rows(value) if name in msg.fed_inputs else value
    seq.open_inputs = set(msg.fed_inputs)


def _append_embeds(core: EngineCore, seq: Sequence, msg: ExecuteNode, count: int, before: int) -> None:
    """Rows of this call that enter as embeddings: ``embed_mask`` [count] marks them,
    ``embeds`` holds one row per marked token, in order."""
    if "embed_mask" not in msg.inputs:
        raise ValueError(f"node {msg.node!r}: input 'embeds' needs 'embed_mask' (which tokens they replace)")
    rows = core.store.resolve(msg.inputs["embeds"])
    mask = core.store.resolve(msg.inputs["embed_mask"]).reshape(-1).bool()
    rows = rows.reshape(-1, rows.shape[-1]) if rows.dim() > 2 else rows
    if mask.numel() != count or rows.dim() != 2 or rows.shape[0] != int(mask.sum()):
        raise ValueError(
            f"node {msg.node!r}: embed_mask marks {int(mask.sum())} of {mask.numel()} tokens "
            f"({count} given) but embeds has shape {tuple(rows.shape)}"
        )
    if not torch.isfinite(rows).all():
        raise ValueError(f"node {msg.node!r}: embeds contain NaN or infinite values")
    dense = torch.zeros(count, rows.shape[1], dtype=torch.float32)
    dense[mask] = rows.float()
    if seq.embeds is None:
        seq.embeds = torch.zeros(before, rows.shape[1])
        seq.embed_mask = torch.zeros(before, dtype=torch.bool)
    seq.embeds = torch.cat([seq.embeds[:before], dense])
    seq.embed_mask = torch.cat([seq.embed_mask[:before], mask])
