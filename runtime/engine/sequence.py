"""One AR sequence: a (request or session) x node-view pair, its tokens, KV blocks and current call."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mstar.engine.block_manager import BlockTable

if TYPE_CHECKING:
    from mstar.engine.flow_state import FlowState
from mstar.engine.messages import ExecuteNode, NodeOutput


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # has tokens to compute, not admitted (no KV yet, or preempted)
    RUNNING = "running"  # admitted: holds KV, scheduled every step while it has work
    IDLE = "idle"  # holds KV, no call in flight (between Walks, or a session between messages)


@dataclass
class ActiveCall:
    msg: ExecuteNode
    reply: Callable[[NodeOutput], None]
    iteration: int = 0
    context_before: int = 0  # len(token_ids) before this call's inputs (to undo a cancelled call)
    rows_sent: int = 0  # row outputs up to this token index went out as step rows (ExecuteNode.step_rows)

    @property
    def wants_token(self) -> bool:
        return self.msg.sampling is not None

    @property
    def max_iters(self) -> int:
        loop = self.msg.loop
        if loop is None:
            return 1
        return loop.max_iters if loop.max_iters is not None else 1 << 62


@dataclass
class Sequence:
    owner: str  # session id, or request id when there is no session
    node: str
    request_id: str
    table: BlockTable
    token_ids: list[int] = field(default_factory=list)  # tokens in the KV window (computed or pending)
    history: list[int] = field(default_factory=list)  # every token ever seen (repetition penalty)
    num_computed: int = 0
    num_generated: int = 0
    status: SeqStatus = SeqStatus.WAITING
    call: ActiveCall | None = None
    generator: torch.Generator | None = None
    arrival: float = field(default_factory=time.monotonic)
    mask: int = 0
    mask_arg: int = 0
    kv_window: int | None = None
    # rows of token_ids that enter as embeddings (images), aligned with token_ids
    embeds: torch.Tensor | None = None  # [len(token_ids), H]
    embed_mask: torch.Tensor | None = None  # [len(token_ids)] bool
    rope_positions: torch.Tensor | None = (
        None  # [axes, n]: given positions of the first n tokens (mstar.engine.rope_positions)
    )
    rope_after: int = 0  # token j >= n sits at j + rope_after on every axis
    # bidirectional [start, end) ranges of absolute positions, sorted and disjoint (mstar.engine.row_spans)
    spans: list[tuple[int, int]] = field(default_factory=list)
    # [<= len(token_ids)] int64: each row's kind, the module's routing flag (mstar.engine.row_kinds); rows past
    # its end are kind 0
    row_kinds: torch.Tensor | None = None
    flow: FlowState | None = None  # an active flow Loop (mstar.engine.flow_loop)
    phase_waits: int = 0  # steps held back to start in phase (mstar.engine.scheduler)
    side_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # call inputs a feedback hook reads
    open_inputs: set[str] = field(default_factory=set)  # side inputs still growing (mstar.engine.fed_inputs)
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # row outputs by token position

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.node)

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def first_position(self) -> int:
        return self.table.first_position

    def truncate(self, n: int) -> None:
        """Keeps the first ``n`` tokens (an abandoned call's inputs go) and the per-row state of those only."""
        del self.token_ids[n:]
        if self.embeds is not None:
            self.embeds, self.embed_mask = self.embeds[:n], self.embed_mask[:n]
        if self.row_kinds is not None:
            self.row_kinds = self.row_kinds[:n]
        end = self.table.first_position + n
        self.spans = [span for span in self.spans if span[1] <= end]

    def drop_front(self, n: int) -> None:
        """The first ``n`` tokens left the KV window (sliding-window eviction advanced first_position)."""
        del self.token_ids[:n]
        if self.embeds is not None:
            self.embeds, self.embed_mask = self.embeds[n:], self.embed_mask[n:]
        if self.row_kinds is not None:
            self.row_kinds = self.row_kinds[n:]
        first = self.table.first_position
        self.spans = [span for span in self.spans if span[1] > first]  # a span before the window is history
