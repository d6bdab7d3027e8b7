"""Moving one AR sequence (tokens, sampler state, computed KV) between engines on different Workers.

Prefill/decode disaggregation places a node's prefill Walk on one rank and its decode
Loop on another: the decode Worker must continue exactly where prefill stopped, so the
computed K/V travel with the tokens, the repetition-penalty history, the seeded
generator's state, the bidirectional spans and the row kinds. If the receiver has no
room for the KV it recomputes the tokens instead (slower, same answer).
"""

from __future__ import annotations

import logging

import torch

from mstar.engine.block_manager import BlockManager, BlockTable, OutOfBlocks
from mstar.engine.kv_cache import PagedKVCache
from mstar.engine.messages import KVState
from mstar.engine.sequence import SeqStatus, Sequence
from mstar.transport.handle import TensorHandle

log = logging.getLogger("mstar.engine.kv")


def gather_kv(seq: Sequence, blocks: BlockManager, cache: PagedKVCache) -> torch.Tensor | None:
    """[layers, 2, num_computed, kv_heads, head_dim] of the sequence's computed tokens."""
    n = seq.num_computed
    if n == 0 or not seq.table.blocks:
        return None
    slots = blocks.slot_mapping(seq.table, 0, n).to(cache.device)
    spec = cache.spec
    k = cache.k.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim).index_select(1, slots)
    v = cache.v.view(spec.num_layers, -1, spec.num_kv_heads, spec.head_dim).index_select(1, slots)
    return torch.stack([k, v], dim=1).cpu()  # exported over the wire: transports read host memory


def sequence_state(seq: Sequence, kv: TensorHandle | None) -> KVState:
    generator = seq.generator.get_state().numpy().tobytes() if seq.generator is not None else b""
    return KVState(
        owner=seq.owner,
        node=seq.node,
        token_ids=list(seq.token_ids),
        history=list(seq.history),
        num_computed=seq.num_computed if kv is not None else 0,
        num_generated=seq.num_generated,
        first_position=seq.table.first_position,
        generator_state=generator,
        kv=kv,
        mask=seq.mask,
        mask_arg=seq.mask_arg,
        kv_window=seq.kv_window,
        spans=list(seq.spans),
        row_kinds=[] if seq.row_kinds is None else seq.row_kinds.tolist(),
    )


def restore_sequence(
    state: KVState, kv: torch.Tensor | None, request_id: str, blocks: BlockManager, cache: PagedKVCache
) -> Sequence:
    """A Sequence equal to the exported one, its KV written into this engine's cache."""
    seq = Sequence(
        owner=state.owner,
        node=state.node,
        request_id=request_id,
        table=BlockTable(blocks=[], first_position=state.first_position),
        token_ids=list(state.token_ids),
        history=list(state.history),
        num_generated=state.num_generated,
        mask=state.mask,
        mask_arg=state.mask_arg,
        kv_window=state.kv_window,
        spans=[(int(a), int(b)) for a, b in state.spans],
        row_kinds=torch.tensor(state.row_kinds, dtype=torch.long) if state.row_kinds else None,
        status=SeqStatus.WAITING,
    )
    seq.generator = torch.Generator(device="cpu")
    if state.generator_state:
        seq.generator.set_state(torch.frombuffer(bytearray(state.generator_state), dtype=torch.uint8))
    n = state.num_computed
    if kv is None or n == 0:
        return seq
    expected = (cache.spec.num_layers, 2, n, cache.spec.num_kv_heads, cache.spec.head_dim)
    if tuple(kv.shape) != expected:
        raise ValueError(f"moved KV for node {state.node!r} has shape {tuple(kv.shape)}, this engine needs {expected}")
    try:
        blocks.append(seq.table, n)
    except OutOfBlocks:
        log.info("no room for %d moved KV tokens of %s/%s: recomputing them", n, state.owner, state.node)
        return seq
    slots = blocks.slot_mapping(seq.table, 0, n).to(cache.device)
    kv = kv.to(device=cache.device)
    for layer in range(cache.spec.num_layers):
        cache.write(layer, slots, kv[layer, 0], kv[layer, 1])
    seq.num_computed = n
    seq.status = SeqStatus.IDLE
    return seq
