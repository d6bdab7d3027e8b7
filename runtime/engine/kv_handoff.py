"""The AR engine's side of moving a sequence between Workers: ExportKV out, ``kv_import`` in."""

from __future__ import annotations

from mstar.engine.engine_core import EngineCore
from mstar.engine.kv_migration import gather_kv, restore_sequence, sequence_state
from mstar.engine.messages import ExecuteNode, ExportKV, KVExported
from mstar.engine.sequence import Sequence


def import_sequence(core: EngineCore, msg: ExecuteNode) -> Sequence:
    """The sequence ``msg.kv_import`` carries, restored into this engine's KV."""
    state = msg.kv_import
    assert state is not None
    kv = core.store.get(state.kv) if state.kv is not None else None
    seq = restore_sequence(state, kv, msg.request_id, core.blocks, core.cache)
    core.scheduler.seqs[seq.key] = seq
    return seq


def export_sequence(core: EngineCore, msg: ExportKV) -> KVExported:
    """Hands the (owner, node) sequence over, then forgets it; the reply says why it cannot."""

    def refuse(text: str) -> KVExported:
        return KVExported(msg.call_id, msg.request_id, error=text)

    seq = core.scheduler.seqs.get((msg.owner, msg.node))
    if seq is None:
        return refuse(f"engine {core.name!r} holds no sequence of node {msg.node!r} for {msg.owner!r}")
    if seq.call is not None:
        return refuse(f"node {msg.node!r} of {msg.owner!r} is still running")
    if seq.embeds is not None or seq.rope_positions is not None:  # needed for any recompute there
        return refuse(
            f"node {msg.node!r}: a sequence with embedding or rope_positions inputs cannot move between Workers yet"
        )
    if core.tp_leader is not None:  # the other ranks' KV heads would stay behind
        return refuse(f"node {msg.node!r} is tensor-parallel: moving its KV between Workers is not supported")
    kv = gather_kv(seq, core.blocks, core.cache)
    handle = None
    if kv is not None:
        handle = core.store.put(kv, owner=msg.request_id)
        if msg.transport != "inproc":
            handle = core.store.export(handle, msg.transport)  # type: ignore[attr-defined]
    state = sequence_state(seq, handle)
    core.scheduler.drop(seq)
    return KVExported(msg.call_id, msg.request_id, state=state)
