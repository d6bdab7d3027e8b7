"""Packs one step's scheduled tokens into tensors, plans attention once, runs the AR module."""
from __future__ import annotations

import time

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionBackend, AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.block_manager import BlockManager
from mstar.engine.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, module: ARModule, backend: AttentionBackend, blocks: BlockManager, device: torch.device) -> None:
        self.module = module
        self.backend = backend
        self.blocks = blocks
        self.device = device
        self._attn = AttentionContext(backend)
        self.forward_seconds = 0.0  # inside the module's forward only (the rest is runtime overhead)

    def run(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, list[int]]:
        """Returns hidden states [T, H] of every packed token and, per scheduled
        sequence, the row of its last token."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        seqs: list[SeqAttention] = []
        last_rows: list[int] = []
        for item in batch:
            seq = item.seq
            first = seq.table.first_position
            seqs.append(SeqAttention(
                query_start=len(ids), query_len=item.num_tokens, context_len=item.end,
                block_table=list(seq.table.blocks), first_position=first,
                mask=MaskKind(seq.mask), mask_arg=seq.mask_arg))
            ids.extend(seq.token_ids[item.start:item.end])
            positions.extend(range(first + item.start, first + item.end))
            slots.append(self.blocks.slot_mapping(seq.table, item.start, item.end))
            last_rows.append(len(ids) - 1)
        meta = AttentionMetadata(seqs=seqs, slot_mapping=torch.cat(slots).to(self.device))
        self.backend.plan(meta)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        started = time.perf_counter()
        hidden = self.module(input_ids, pos, self._attn)
        self.forward_seconds += time.perf_counter() - started
        return hidden, last_rows
