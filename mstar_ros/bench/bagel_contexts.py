"""The reference's per-context KV caches for the BAGEL bench's baseline, on the engine's own kernels.

ByteDance's inferencer keeps one KV cache per context (full, no-text, no-image), each grown by batch-1
LLM calls and deep-copied where one context starts as another (``cfg_text = deepcopy(gen)``). This
module does the same with our modules and the engine's attention backend (the torch SDPA kernels the
engine selects on CPU), so the bench's baseline differs from the served path in how work is scheduled,
not in what computes it:

- :class:`ContextPool`: one paged K/V pool (``PagedKVCache``) and the attention backend over it;
  every context owns its own blocks (nothing is shared, as in the reference);
- :class:`Context`: one context: ``extend`` appends a laid-out call (text, an image span, a decode
  token) and writes its K/V; ``copy`` is the reference's deep copy; ``flow_rows`` is a flow
  evaluation's attention over the context plus the N + 2 query rows, which are written after the
  context and never kept (the reference's ``update_past_key_values=False``).

Call everything on the device thread (``mstar.engine.device_loop.run_on_device``) under
``torch.inference_mode``, as the engines run.
"""

from __future__ import annotations

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.attention.select import select_attention_backend
from mstar.engine.flow_plan import FlowEval, FlowPlan
from mstar.engine.kv_cache import PagedKVCache
from mstar_graphs.bagel.context_layout import Markers, Part, view_inputs


class ContextPool:
    """K/V blocks for every context of the baseline (``rows`` token slots in all), one attention backend."""

    def __init__(
        self, module, markers: Markers, rows: int, block_size: int = 16, attention_backend: str | None = None
    ) -> None:
        self.module = module
        self.markers = markers
        self.block_size = block_size
        blocks = -(-rows // block_size)
        self.cache = PagedKVCache(module.kv_spec(), blocks, block_size, module.dtype, torch.device("cpu"))
        self.backend = select_attention_backend(self.cache, attention_backend)
        self.attn = AttentionContext(self.backend)
        self._free = list(range(blocks))

    def context(self) -> Context:
        return Context(self)

    def take(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"the baseline's KV pool is full: {count} blocks wanted, {len(self._free)} free")
        taken, self._free = self._free[:count], self._free[count:]
        return taken

    def give_back(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    def plan(self, seqs: list[SeqAttention], slots: list[torch.Tensor]) -> None:
        """One forward's attention plan: these sequences, their new rows at ``slots`` in batch order."""
        self.backend.plan(AttentionMetadata(seqs=seqs, slot_mapping=torch.cat(slots)))


class Context:
    """One context's KV: ``length`` cached rows, ``rope`` the next rope position (BAGEL's counter)."""

    def __init__(self, pool: ContextPool) -> None:
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0
        self.rope = 0

    def _room(self, rows: int) -> None:
        need = -(-(self.length + rows) // self.pool.block_size) - len(self.blocks)
        if need > 0:
            self.blocks += self.pool.take(need)

    def _slots(self, start: int, end: int) -> torch.Tensor:
        j = torch.arange(start, end)
        table = torch.tensor(self.blocks, dtype=torch.int64)
        return table[j // self.pool.block_size] * self.pool.block_size + j % self.pool.block_size

    def extend(self, parts: list[Part], embeds: torch.Tensor | None = None, *, need_hidden: bool = False):
        """Append one batch-1 LLM call of ``parts`` (laid out from this context's rope counter: causal, image
        spans bidirectional) and return its final hidden states (None with ``need_hidden=False``: a context
        prefill, from which nothing is read). ``embeds`` [n, hidden]: the call's image rows, in span order."""
        call = view_inputs(parts, self.pool.markers, self.rope)
        n = call.num_rows
        self._room(n)
        spans = tuple((self.length + int(a), self.length + int(b)) for a, b in call.spans.tolist())
        seq = SeqAttention(0, n, self.length + n, list(self.blocks), mask=MaskKind.CAUSAL, spans=spans)
        self.pool.plan([seq], [self._slots(self.length, self.length + n)])
        module = self.pool.module
        rows = None
        if embeds is not None:
            rows = torch.zeros(n, module.hidden_size, dtype=module.dtype)
            rows[call.embed_mask] = embeds.to(module.dtype)
        hidden = module(
            call.input_ids,
            torch.arange(self.length, self.length + n),
            self.pool.attn,
            embeds=rows,
            embed_mask=call.embed_mask if embeds is not None else None,
            rope_positions=call.rope_positions,
            row_kinds=call.row_kinds if call.images else None,
            need_hidden=need_hidden,
        )
        self.length += n
        self.rope = call.next_position
        return hidden if need_hidden else None

    def decode(self, token: int) -> torch.Tensor:
        """One decode step: ``token`` at the next position -> its final hidden state [1, hidden]."""
        self._room(1)
        seq = SeqAttention(0, 1, self.length + 1, list(self.blocks))
        self.pool.plan([seq], [self._slots(self.length, self.length + 1)])
        hidden = self.pool.module(
            torch.tensor([token]),
            torch.tensor([self.length]),
            self.pool.attn,
            rope_positions=torch.tensor([[self.rope]]),
        )
        self.length += 1
        self.rope += 1
        return hidden

    def copy(self) -> Context:
        """The reference's ``deepcopy`` of a context: its own blocks holding the same K/V."""
        other = Context(self.pool)
        other._room(self.length)
        other.length, other.rope = self.length, self.rope
        used = -(-self.length // self.pool.block_size)
        self.pool.cache.copy_blocks(list(zip(self.blocks[:used], other.blocks[:used])))
        return other

    def flow_rows(self, rows: int) -> tuple[SeqAttention, torch.Tensor, torch.Tensor]:
        """(attention of ``rows`` flow query rows placed at ``query_start`` 0, their slots, their rope
        positions): they see the whole context and each other and are overwritten by the next step."""
        self._room(rows)
        end = self.length + rows
        seq = SeqAttention(0, rows, end, list(self.blocks), mask=MaskKind.PREFIX_BIDIRECTIONAL, mask_arg=end)
        return seq, self._slots(self.length, end), self.rope + torch.arange(rows)

    def free(self) -> None:
        self.pool.give_back(self.blocks)
        self.blocks, self.length, self.rope = [], 0, 0


def flow_velocities(
    pool: ContextPool,
    contexts: list[Context],
    x: torch.Tensor,
    t: float,
    inputs: dict[str, torch.Tensor],
    plan: FlowPlan,
    step: int,
) -> list[torch.Tensor]:
    """ONE forward of the flow rows of ``x`` [N, C] at time ``t`` over each of ``contexts`` (one context: the
    reference's batch-1 call; several: what the served path's engine step does), through the module's own
    ``flow_velocity`` -> one velocity [N, C] (float32) per context."""
    seqs, slots, positions = [], [], []
    start = 0
    for context in contexts:
        seq, where, rope = context.flow_rows(plan.rows)
        seq.query_start = start
        start += plan.rows
        seqs.append(seq)
        slots.append(where)
        positions.append(rope)
    pool.plan(seqs, slots)
    b = len(contexts)
    evals = [FlowEval(inputs, plan, branch, step) for branch in range(b)]
    v = pool.module.flow_velocity(
        x[None].expand(b, *x.shape), torch.full((b,), t), torch.cat(positions), pool.attn, evals
    )
    return [row.float() for row in v]
