"""What the TP leader (rank 0's AREngine) tells its followers, and the leader side that sends it.

Rank 0 alone schedules, manages blocks and samples. Before each collective-bearing call
it broadcasts a plan so every follower makes the same call on its own shard:

- ``Hello`` once, when the engine is built: KV pool size, dtypes, attention backend.
- FORWARD per step: the KV block copies the scheduler made (copy-on-write), the packed
  ids / positions, the attention metadata (per sequence + slot mapping), and the rows that
  enter as embeddings (an audio prompt's encoder rows): which rows, and their values as raw
  float32 bytes (msgpack bin, not a list of floats); the rows' multi-axis RoPE positions
  when a sequence has some (mstar.engine.rope_positions); the bidirectional spans of each
  sequence (mstar.engine.row_spans) and the rows' kinds for a module that takes them
  (mstar.engine.row_kinds).
- LOGITS when the step samples: which hidden rows and which vocabulary subset.
- SHUTDOWN when the engine closes: followers return from their loop.
"""

from __future__ import annotations

import logging
from enum import IntEnum

import msgspec
import torch

from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.layers.vocab_constraint import contiguous_runs
from mstar.parallel.group import TPGroup

log = logging.getLogger("mstar.parallel")


class PlanKind(IntEnum):
    FORWARD = 1
    LOGITS = 2
    SHUTDOWN = 3


class Hello(msgspec.Struct, array_like=True):
    num_blocks: int
    block_size: int
    dtype: str
    kv_dtype: str
    attention_backend: str
    pack_linears: bool = True  # followers pack their bf16 CPU linears as the leader does


class SeqPlan(msgspec.Struct, array_like=True):
    query_start: int
    query_len: int
    context_len: int
    block_table: list[int]
    first_position: int
    mask: int
    mask_arg: int
    spans: list[tuple[int, int]] = []  # bidirectional spans (absolute positions) the queries lie in


class StepPlan(msgspec.Struct, array_like=True):
    kind: int
    copies: list[tuple[int, int]] = []
    ids: list[int] = []
    positions: list[int] = []
    seqs: list[SeqPlan] = []
    slots: list[int] = []
    rows: list[int] = []
    vocab: list[tuple[int, int]] | None = None  # [lo, hi) runs of the vocabulary subset; None: all
    embed_rows: list[int] = []  # packed rows that enter as embeddings
    embed_width: int = 0
    embeds: bytes = b""  # float32 [len(embed_rows), embed_width], row-major
    rope_axes: int = 0  # > 0: rope_positions [rope_axes, len(ids)], flattened row-major
    rope_positions: list[int] = []
    row_kinds: list[int] | None = None  # the rows' kinds (mstar.engine.row_kinds) for a module that takes them


def plan_embeds(plan: StepPlan, device: torch.device) -> dict[str, torch.Tensor]:
    """The module's ``embeds`` / ``embed_mask`` / ``rope_positions`` / ``row_kinds`` inputs of a FORWARD plan
    (those it has)."""
    out: dict[str, torch.Tensor] = {}
    if plan.row_kinds is not None:
        out["row_kinds"] = torch.tensor(plan.row_kinds, dtype=torch.long, device=device)
    if plan.rope_axes:
        out["rope_positions"] = (
            torch.tensor(plan.rope_positions, dtype=torch.long).reshape(plan.rope_axes, -1).to(device)
        )
    if not plan.embed_rows:
        return out
    n, width = len(plan.ids), plan.embed_width
    rows = torch.tensor(plan.embed_rows, dtype=torch.long)
    values = torch.frombuffer(bytearray(plan.embeds), dtype=torch.float32).reshape(len(plan.embed_rows), width)
    embeds = torch.zeros(n, width)
    embeds[rows] = values
    mask = torch.zeros(n, dtype=torch.bool)
    mask[rows] = True
    return {**out, "embeds": embeds.to(device), "embed_mask": mask.to(device)}


def plan_metadata(plan: StepPlan, device: torch.device) -> AttentionMetadata:
    seqs = [
        SeqAttention(
            s.query_start,
            s.query_len,
            s.context_len,
            s.block_table,
            s.first_position,
            MaskKind(s.mask),
            s.mask_arg,
            tuple((a, b) for a, b in s.spans),
        )
        for s in plan.seqs
    ]
    return AttentionMetadata(seqs=seqs, slot_mapping=torch.tensor(plan.slots, dtype=torch.long, device=device))


class _CopyRecorder:
    """Stands in for the leader's PagedKVCache in the scheduler: applies block copies
    and remembers them for the next FORWARD plan."""

    def __init__(self, cache, pending: list[tuple[int, int]]) -> None:
        self._cache, self._pending = cache, pending

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._pending.extend(pairs)
        self._cache.copy_blocks(pairs)

    def __getattr__(self, name: str):
        return getattr(self._cache, name)


class TPLeader:
    """Rank 0's side of the plan protocol (AREngine owns one when ``tp.size > 1``)."""

    def __init__(self, tp: TPGroup) -> None:
        if not tp.is_leader:
            raise ValueError(f"the AR engine runs on tensor-parallel rank 0; rank {tp.rank} runs a TPFollower")
        self.tp = tp
        self.closed = False
        self._copies: list[tuple[int, int]] = []

    def track_copies(self, cache):
        return _CopyRecorder(cache, self._copies)

    def hello(self, hello: Hello) -> None:
        self.tp.broadcast(hello, Hello)

    def _send(self, plan: StepPlan) -> None:
        if self.closed:
            raise RuntimeError("the tensor-parallel group was shut down (engine closed)")
        self.tp.broadcast(plan, StepPlan)

    def forward_plan(
        self,
        ids: list[int],
        positions: list[int],
        seqs: list[SeqAttention],
        slot_mapping: torch.Tensor,
        embeds: torch.Tensor | None = None,
        embed_mask: torch.Tensor | None = None,
        rope_positions: torch.Tensor | None = None,
        row_kinds: torch.Tensor | None = None,
    ) -> None:
        copies, self._copies[:] = list(self._copies), []
        rows: list[int] = []
        values, width = b"", 0
        if embeds is not None and embed_mask is not None and bool(embed_mask.any()):
            picked = embed_mask.nonzero().reshape(-1).cpu()
            rows, width = picked.tolist(), embeds.shape[1]
            values = embeds.index_select(0, picked.to(embeds.device)).float().cpu().contiguous().numpy().tobytes()
        self._send(
            StepPlan(
                PlanKind.FORWARD,
                copies,
                ids,
                positions,
                [
                    SeqPlan(
                        s.query_start,
                        s.query_len,
                        s.context_len,
                        s.block_table,
                        s.first_position,
                        int(s.mask),
                        s.mask_arg,
                        list(s.spans),
                    )
                    for s in seqs
                ],
                slot_mapping.tolist(),
                embed_rows=rows,
                embed_width=width,
                embeds=values,
                rope_axes=0 if rope_positions is None else rope_positions.shape[0],
                rope_positions=[] if rope_positions is None else rope_positions.reshape(-1).tolist(),
                row_kinds=None if row_kinds is None else row_kinds.reshape(-1).tolist(),
            )
        )

    def logits_plan(self, rows: list[int], vocab: torch.Tensor | None) -> None:
        runs = None if vocab is None else contiguous_runs(vocab, max_runs=max(1, vocab.numel()))
        self._send(StepPlan(PlanKind.LOGITS, rows=list(rows), vocab=runs))

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._send(StepPlan(PlanKind.SHUTDOWN))
        except Exception:  # followers already gone: nothing left to tell them
            log.warning("tensor parallel: could not send the shutdown plan", exc_info=True)
        self.closed = True
