"""What the AR engine's loops share: the module, its paged KV, the scheduler's sequences, the runner.

The token, flow and frame loops each get this core, not the engine that owns them: it is
everything they read or change besides their own calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionBackend
from mstar.engine.block_manager import BlockManager, BlockTable
from mstar.engine.compiled_forward import CompiledForward
from mstar.engine.config import EngineConfig
from mstar.engine.kv_cache import PagedKVCache
from mstar.engine.messages import ExecuteNode, NodeOutput
from mstar.engine.model_runner import ModelRunner
from mstar.engine.sampler import Sampler
from mstar.engine.scheduler import Scheduler
from mstar.engine.sequence import SeqStatus, Sequence
from mstar.engine.tp_plan import TPLeader
from mstar.transport.inprocess import InProcessTensorStore


@dataclass
class EngineCore:
    name: str
    module: ARModule
    config: EngineConfig
    device: torch.device
    store: InProcessTensorStore
    cache: PagedKVCache
    blocks: BlockManager
    backend: AttentionBackend
    scheduler: Scheduler  # every token and flow sequence (a flow forks its prefix view's sequence)
    runner: ModelRunner
    sampler: Sampler
    tp_leader: TPLeader | None = None
    on_fatal: Callable[[str], None] | None = None  # the engine cannot go on (a tensor-parallel group broke)
    busy_seconds: float = 0.0  # time inside model steps (to tell compute from overhead)

    @contextmanager
    def busy(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.busy_seconds += time.perf_counter() - started

    def stats(self) -> dict[str, int]:
        return {
            "kv_blocks_total": self.blocks.num_blocks,
            "kv_blocks_used": self.blocks.num_used_blocks,
            "busy_ms": int(self.busy_seconds * 1000),
            "forward_ms": int(self.runner.forward_seconds * 1000),
            "forward_compiled": int(
                isinstance(forward := self.runner.forward, CompiledForward) and forward.failed is None
            ),
        }

    def fail_call(self, seq: Sequence, error: str) -> None:
        call, seq.call = seq.call, None
        if call is not None:
            call.reply(NodeOutput(call.msg.call_id, call.msg.request_id, call.iteration, final=True, error=error))

    def release_sequences(self, request_id: str, mine: Callable[[Sequence], bool]) -> None:
        """The Conductor let go of ``request_id``: its own sequences go; a session keeps its history
        and drops the abandoned call's uncomputed tokens. ``mine``: the loop's sequences."""
        for seq in [s for s in self.scheduler.seqs.values() if s.request_id == request_id and mine(s)]:
            if seq.owner == request_id:
                self.scheduler.drop(seq)
                continue
            keep = max(seq.num_computed, seq.call.context_before if seq.call else len(seq.token_ids))
            seq.call = None
            seq.truncate(keep)
            seq.status = SeqStatus.IDLE

    def close_sequences(self, session_id: str, mine: Callable[[Sequence], bool]) -> None:
        """The session ended: its sequences go, and a call still in flight fails."""
        for seq in [s for s in self.scheduler.seqs.values() if s.owner == session_id and mine(s)]:
            self.fail_call(seq, f"session {session_id!r} was closed")
            self.scheduler.drop(seq)

    def tokens_hold_blocks(self) -> bool:
        """Whether sequences of the scheduler hold KV blocks (they may free them later)."""
        return any(s.table.blocks for s in self.scheduler.seqs.values())

    def new_sequence(
        self, msg: ExecuteNode, owner: str, node: str | None = None, view: str | None = None, empty_ok: bool = False
    ) -> Sequence:
        """A sequence for ``msg``'s node (or ``node``: a flow's guidance branch), forked (copy-on-write)
        from its ``kv_from`` view (or ``view``) if any. ``empty_ok``: a view with no sequence for
        ``owner`` yet gives an empty sequence (an empty context) instead of an error."""
        node = node or msg.node
        view = view or msg.kv_from
        seq = Sequence(owner=owner, node=node, request_id=msg.request_id, table=BlockTable(blocks=[]))
        source = self.scheduler.seqs.get((owner, view)) if view else None
        if view and ((source is None and not empty_ok) or (source is not None and source.call is not None)):
            state = "has no KV yet" if source is None else "is still running"
            raise ValueError(f"node {msg.node!r} forks its KV from {view!r}, which {state} for {owner!r}")
        if source is not None:
            self._fork(seq, source)
        node_salt = sum(ord(c) * 31**i for i, c in enumerate(node)) % 1_000_003  # stable across runs
        seq.generator = torch.Generator(device="cpu").manual_seed((msg.seed * 1_000_003 + node_salt) % (2**63))
        self.scheduler.seqs[seq.key] = seq
        return seq

    def _fork(self, seq: Sequence, source: Sequence) -> None:
        if source.table.blocks:  # copy-on-write fork: shares every computed block with the source view
            seq.table = self.blocks.fork(source.table)
            seq.num_computed = source.num_computed
            seq.token_ids = list(source.token_ids[: source.num_computed])
        else:  # the source was preempted: same tokens, recomputed
            seq.table.first_position = source.table.first_position
            seq.token_ids = list(source.token_ids)
        seq.history = list(source.history)
        seq.mask, seq.mask_arg = source.mask, source.mask_arg  # a recompute must see what the source saw
        n = len(seq.token_ids)
        if source.embeds is not None:
            seq.embeds, seq.embed_mask = source.embeds[:n], source.embed_mask[:n]
        if source.row_kinds is not None:
            seq.row_kinds = source.row_kinds[:n]
        end = seq.table.first_position + n
        seq.spans = [span for span in source.spans if span[1] <= end]
        seq.rope_positions, seq.rope_after = source.rope_positions, source.rope_after
        seq.num_generated = source.num_generated
        seq.arrival = source.arrival
