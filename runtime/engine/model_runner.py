"""Packs one step's scheduled tokens into tensors, plans attention once, runs the AR module."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionBackend, AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.block_manager import BlockManager
from mstar.engine.rope_positions import packed_rope_positions
from mstar.engine.row_kinds import accepts_row_kinds, packed_row_kinds
from mstar.engine.row_spans import spans_in
from mstar.engine.scheduler import ScheduledSeq

SHORT_CHUNK = 8  # tokens per sequence up to which a step's slots are packed as Python ints

# a step before its forward: ids, positions, per-sequence attention, slot mapping (CPU),
# embeds [T, W] | None, embed_mask [T] | None, rope_positions [axes, T] | None, row_kinds [T] | None
PlanHook = Callable[
    [
        list[int],
        list[int],
        list[SeqAttention],
        torch.Tensor,
        torch.Tensor | None,
        torch.Tensor | None,
        torch.Tensor | None,
        torch.Tensor | None,
    ],
    None,
]


class ModelRunner:
    def __init__(
        self,
        module: ARModule,
        backend: AttentionBackend,
        blocks: BlockManager,
        device: torch.device,
        plan_hook: PlanHook | None = None,
    ) -> None:
        self.module = module
        self.plan_hook = plan_hook  # tensor parallel: rank 0 sends the step to its followers
        self.backend = backend
        self.blocks = blocks
        self.device = device
        self._attn = AttentionContext(backend)
        self.forward: Callable[..., torch.Tensor] = module  # or its CompiledForward (compile: true)
        self.forward_seconds = 0.0  # inside the module's forward only (the rest is runtime overhead)

    def run(
        self, batch: list[ScheduledSeq], need_hidden: bool = True, last_rows_only: bool = False
    ) -> tuple[torch.Tensor, list[int]]:
        """Returns hidden states [T, H] of every packed token and, per scheduled
        sequence, the row of its last token. ``need_hidden=False``: nothing will be sampled
        from this step, and a module that says ``accepts_need_hidden`` may compute only its KV.
        ``last_rows_only``: the caller reads only the sequences' last rows; a module that says
        ``accepts_hidden_rows`` then returns just those ([len(batch), H], the returned rows index it)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        slot_list: list[int] = []
        seqs: list[SeqAttention] = []
        last_rows: list[int] = []
        # decode steps (a few tokens per sequence): slots as Python ints, and ids, positions and slots
        # leave as one tensor (one host-to-device copy)
        short = all(item.num_tokens <= SHORT_CHUNK for item in batch)
        for item in batch:
            seq = item.seq
            first = seq.table.first_position
            seqs.append(
                SeqAttention(
                    query_start=len(ids),
                    query_len=item.num_tokens,
                    context_len=item.end,
                    block_table=list(seq.table.blocks),
                    first_position=first,
                    mask=MaskKind(seq.mask),
                    mask_arg=seq.mask_arg,
                    spans=spans_in(seq, item.start, item.end),
                )
            )
            ids.extend(seq.token_ids[item.start : item.end])
            positions.extend(range(first + item.start, first + item.end))
            if short:
                slot_list.extend(self.blocks.slots(seq.table, item.start, item.end))
            else:
                slots.append(self.blocks.slot_mapping(seq.table, item.start, item.end))
            last_rows.append(len(ids) - 1)
        embeds, embed_mask = self._embeds(batch)
        rope = packed_rope_positions(batch)
        kinds = packed_row_kinds(batch) if accepts_row_kinds(self.module) else None
        if short:
            packed = torch.tensor([ids, positions, slot_list], dtype=torch.long)
            slot_mapping = packed[2]
            input_ids, pos, device_slots = packed.to(self.device).unbind(0)
        else:
            slot_mapping = torch.cat(slots)
            input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
            pos = torch.tensor(positions, dtype=torch.long, device=self.device)
            device_slots = slot_mapping.to(self.device)
        if self.plan_hook is not None:
            self.plan_hook(ids, positions, seqs, slot_mapping, embeds, embed_mask, rope, kinds)
        meta = AttentionMetadata(seqs=seqs, slot_mapping=device_slots)
        self.backend.plan(meta)
        started = time.perf_counter()
        extra: dict = {} if embeds is None else {"embeds": embeds, "embed_mask": embed_mask}
        if rope is not None:
            extra["rope_positions"] = rope.to(self.device)
        if kinds is not None:
            extra["row_kinds"] = kinds.to(self.device)
        if not need_hidden and getattr(self.module, "accepts_need_hidden", False):
            extra["need_hidden"] = False
        # a prefill's last layer then runs its o_proj and MLP on the sampled rows only (tensor
        # parallel followers run the full step: their row-parallel reductions must match the leader's)
        narrow = (
            need_hidden
            and last_rows_only
            and self.plan_hook is None
            and len(last_rows) < len(ids)
            and getattr(self.module, "accepts_hidden_rows", False)
        )
        if narrow:
            extra["hidden_rows"] = torch.tensor(last_rows, dtype=torch.long, device=self.device)
        hidden = self.forward(input_ids, pos, self._attn, **extra)
        if narrow:
            last_rows = list(range(len(last_rows)))
        self.forward_seconds += time.perf_counter() - started
        return hidden, last_rows

    def _embeds(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Rows that enter as embeddings (image tokens), packed like the ids; None when no row does."""
        if all(item.seq.embeds is None for item in batch):
            return None, None
        # rows of several widths (an audio prompt's [H], an image's [H * (1 + deepstack)]) share one tensor,
        # the narrower zero-padded: a module reads what it needs of a row
        width = max(item.seq.embeds.shape[1] for item in batch if item.seq.embeds is not None)
        rows, masks = [], []
        for item in batch:
            seq = item.seq
            if seq.embeds is None:
                rows.append(torch.zeros(item.num_tokens, width))
                masks.append(torch.zeros(item.num_tokens, dtype=torch.bool))
            else:  # tokens appended after the embedding rows (a decode after an image / audio prompt) have none
                part, mask = seq.embeds[item.start : item.end], seq.embed_mask[item.start : item.end]
                if part.shape[1] < width:
                    part = torch.nn.functional.pad(part, (0, width - part.shape[1]))
                short = item.num_tokens - part.shape[0]
                if short:
                    part = torch.cat([part, torch.zeros(short, width, dtype=part.dtype)])
                    mask = torch.cat([mask, torch.zeros(short, dtype=torch.bool)])
                rows.append(part)
                masks.append(mask)
        return torch.cat(rows).to(self.device), torch.cat(masks).to(self.device)
