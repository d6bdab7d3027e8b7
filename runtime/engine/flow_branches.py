"""A flow's KV branches: one forked sequence per branch, and the attention plan of a batched evaluation.

Branch 0 forks the flow node's ``kv_from`` view; branch i > 0 forks the i-th guidance view, or is
empty when that view has no sequence for the owner yet (it then attends only to its own rows).
Each branch reserves ``plan.rows`` slots after its KV and rewrites them at every evaluation; its
rows see the branch's whole KV and each other, nothing of other branches or flows.
"""

from __future__ import annotations

import math

import torch

from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.block_manager import BlockManager
from mstar.engine.engine_core import EngineCore
from mstar.engine.loop_contract import CallRefused
from mstar.engine.messages import ExecuteNode
from mstar.engine.rope_positions import rope_positions_of
from mstar.engine.sequence import Sequence


def branch_node(node: str, view: str) -> str:
    """The sequence name of ``node``'s guidance branch over ``view`` (its scheduler key with the owner)."""
    return f"{node}<guidance:{view}>"


def fork_branches(core: EngineCore, msg: ExecuteNode, owner: str, branches: int) -> list[Sequence]:
    """The flow's branch sequences, registered in the scheduler: the main fork, then one per guidance
    view used. On an error none stays registered."""
    seqs: list[Sequence] = []
    try:
        seqs.append(core.new_sequence(msg, owner))
        for view in msg.guidance[: branches - 1]:
            seqs.append(core.new_sequence(msg, owner, node=branch_node(msg.node, view), view=view, empty_ok=True))
    except Exception:
        for seq in seqs:
            core.scheduler.drop(seq)
        raise
    return seqs


def check_fits(core: EngineCore, node: str, seqs: list[Sequence], rows: int) -> None:
    """CallRefused when the branches' KV and suffix rows could never fit the pool together."""
    blocks = core.blocks
    held: set[int] = set()
    need = 0
    for seq in seqs:
        if seq.table.blocks:
            held.update(seq.table.blocks)
            need += blocks.blocks_needed(seq.table, rows)
        else:  # to be recomputed (or empty): all of it
            need += math.ceil((len(seq.token_ids) + rows) / blocks.block_size)
    if len(held) + need > blocks.num_blocks:
        raise CallRefused(
            f"node {node!r}: the flow's {len(seqs)} branches need {len(held) + need} KV blocks "
            f"({rows} rows each after their context), the pool has {blocks.num_blocks}"
        )


def next_rope_position(seq: Sequence) -> int:
    """Where a row after ``seq``'s tokens sits: past the largest given rope position, else its KV position."""
    n = len(seq.token_ids)
    if seq.rope_positions is None:
        return seq.table.first_position + n
    return int(rope_positions_of(seq, n, n + 1, axes=seq.rope_positions.shape[0])[0, 0])


def evaluation_metadata(
    seqs: list[Sequence], rows: list[int], blocks: BlockManager, device: torch.device
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Attention plan and positions of one batched evaluation: ``rows[i]`` suffix rows of branch
    sequence ``seqs[i]``, which see its whole KV and each other, nothing of the other sequences."""
    plans, slots, positions = [], [], []
    start = 0
    for seq, n in zip(seqs, rows):
        prefix = len(seq.token_ids)
        first = seq.table.first_position
        end = prefix + n
        plans.append(
            SeqAttention(
                query_start=start,
                query_len=n,
                context_len=end,
                block_table=list(seq.table.blocks),
                first_position=first,
                mask=MaskKind.PREFIX_BIDIRECTIONAL,
                mask_arg=first + end,
            )
        )
        slots.append(blocks.slot_mapping(seq.table, prefix, end))
        positions.append(next_rope_position(seq) + torch.arange(n))
        start += n
    meta = AttentionMetadata(seqs=plans, slot_mapping=torch.cat(slots).to(device))
    return meta, torch.cat(positions).to(device)
