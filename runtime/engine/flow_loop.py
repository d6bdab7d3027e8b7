"""Flow-matching Loops in the AR engine: Euler steps of a continuous state over persisted KV.

A flow node (``GraphNode(..., engine="ar", loop_mode=LoopMode.FLOW, kv_from=PREFIX)``) forks the KV
its prefix view computed once (copy-on-write: the prefix is never recomputed per
step) and reserves ``H`` more slots for its suffix rows. Every iteration the module's
``flow_velocity(x, t, positions, attn)`` evaluates the suffix - writing the suffix K/V
into the same reserved slots - and the engine takes an Euler step
``x += dt * v`` from t = 1 (noise) to t = 0. The flows of every sequence that is in
a flow Loop share one batched evaluation per engine step, whatever their step.

Inpainting (real-time chunking): with inputs ``guide`` [H, A] and ``guide_weights`` [H]
the state is pulled, after every step, toward the guide noised to the current time
(``t * noise + (1 - t) * guide``) by the weights, so a chunk's first actions agree
with the ones a robot executes while the chunk is computed and the seam is smooth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.block_manager import BlockManager
from mstar.engine.engine_core import EngineCore
from mstar.engine.engine_inbox import Reply
from mstar.engine.loop_contract import CallRefused, EngineLoop
from mstar.engine.messages import ExecuteNode, NodeOutput
from mstar.engine.sequence import ActiveCall, SeqStatus, Sequence

DEFAULT_STEPS = 10


@dataclass
class FlowState:
    x: torch.Tensor  # [H, A] float32, the state at time ``t``
    noise: torch.Tensor  # [H, A], x at t = 1
    steps: int
    guide: torch.Tensor | None = None
    weights: torch.Tensor | None = None  # [H, 1]
    step: int = 0
    reserved: bool = False  # the H suffix slots are in the table

    @property
    def t(self) -> float:
        return 1.0 - self.step / self.steps

    @property
    def dt(self) -> float:
        return -1.0 / self.steps

    def advance(self, velocity: torch.Tensor) -> None:
        self.x = self.x + self.dt * velocity.float()
        self.step += 1
        if self.guide is not None and self.weights is not None:
            t = self.t
            target = t * self.noise + (1.0 - t) * self.guide
            self.x = self.weights * target + (1.0 - self.weights) * self.x

    @property
    def done(self) -> bool:
        return self.step >= self.steps


def make_flow_state(
    inputs: dict[str, torch.Tensor], horizon: int, action_dim: int, steps: int, generator: torch.Generator | None
) -> FlowState:
    """The flow's start from the call's inputs; errors name the bad input."""
    noise = inputs.get("x")
    if noise is None:  # no noise given: draw it from the request's seeded generator
        noise = torch.randn((horizon, action_dim), generator=generator)
    noise = noise.float().reshape(-1, action_dim) if noise.numel() == horizon * action_dim else noise
    if tuple(noise.shape) != (horizon, action_dim):
        raise ValueError(
            f"flow input 'x' (noise) has shape {tuple(noise.shape)}, the model needs {(horizon, action_dim)}"
        )
    if not torch.isfinite(noise).all():
        raise ValueError("flow input 'x' (noise) has NaN or infinite values")
    guide, weights = inputs.get("guide"), inputs.get("guide_weights")
    if (guide is None) != (weights is None):
        raise ValueError("flow inputs 'guide' and 'guide_weights' come together")
    if guide is not None:
        guide, weights = guide.float(), weights.float().reshape(-1, 1)
        if tuple(guide.shape) != (horizon, action_dim) or weights.shape[0] != horizon:
            raise ValueError(
                f"flow 'guide' must be {(horizon, action_dim)} and 'guide_weights' ({horizon},); got "
                f"{tuple(guide.shape)} and {tuple(weights.shape)}"
            )
        if not (torch.isfinite(guide).all() and torch.isfinite(weights).all()):
            raise ValueError("flow 'guide' or 'guide_weights' has NaN or infinite values")
        weights = weights.clamp(0.0, 1.0)
    return FlowState(x=noise.clone(), noise=noise, steps=steps, guide=guide, weights=weights)


def flow_metadata(
    seqs: list[Sequence], blocks: BlockManager, horizon: int, device: torch.device
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Attention plan and positions of one batched flow evaluation: each sequence's H suffix
    rows see its whole prefix and each other (bidirectional), nothing of other sequences."""
    plans, slots, positions = [], [], []
    for i, seq in enumerate(seqs):
        prefix = len(seq.token_ids)
        first = seq.table.first_position
        end = prefix + horizon
        plans.append(
            SeqAttention(
                query_start=i * horizon,
                query_len=horizon,
                context_len=end,
                block_table=list(seq.table.blocks),
                first_position=first,
                mask=MaskKind.PREFIX_BIDIRECTIONAL,
                mask_arg=first + end,
            )
        )
        slots.append(blocks.slot_mapping(seq.table, prefix, end))
        positions.append(torch.arange(first + prefix, first + end))
    meta = AttentionMetadata(seqs=plans, slot_mapping=torch.cat(slots).to(device))
    return meta, torch.cat(positions).to(device)


def _is_flow(seq: Sequence) -> bool:
    return seq.flow is not None


class FlowLoop(EngineLoop):
    """The AR engine's flow calls: started by ``start``, advanced one batched Euler step per ``step``.
    Their sequences live in the core's scheduler, which recomputes a preempted prefix."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.attn = AttentionContext(core.backend)
        self.evaluations = 0

    def _active(self) -> list[Sequence]:
        return [
            s
            for s in self.core.scheduler.seqs.values()
            if s.flow is not None and s.call is not None and s.num_pending == 0
        ]

    def has_work(self) -> bool:
        return any(True for _ in self._active())

    def stats(self) -> dict[str, int]:
        return {}

    def release(self, request_id: str) -> None:
        self.core.release_sequences(request_id, _is_flow)

    def close_session(self, session_id: str) -> None:
        self.core.close_sequences(session_id, _is_flow)

    def fail_all(self, error: Exception) -> None:
        """Every flow in flight fails and goes (its suffix slots may be half-written)."""
        for seq in [s for s in self.core.scheduler.seqs.values() if s.flow is not None and s.call is not None]:
            self.core.fail_call(seq, f"flow step failed: {type(error).__name__}: {error}")
            self.core.scheduler.drop(seq)

    def start(self, msg: ExecuteNode, reply: Reply) -> None:
        """Validates a flow call and forks its sequence from the prefix view's KV."""
        core = self.core
        module = core.module
        if core.tp_leader is not None:
            raise CallRefused(f"flow node {msg.node!r}: flow Loops are not supported with tensor parallelism yet")
        if not hasattr(module, "flow_velocity"):
            raise ValueError(
                f"node {msg.node!r} is a flow node but module {type(module).__name__} has no flow_velocity"
            )
        if not msg.kv_from:
            raise ValueError(f"flow node {msg.node!r} needs kv_from: the prefix view whose KV it reads")
        owner = msg.session_id or msg.request_id
        old = core.scheduler.seqs.get((owner, msg.node))
        if old is not None:
            if old.call is not None:
                raise ValueError(f"node {msg.node!r} already has a call in flight for {owner!r}")
            core.scheduler.drop(old)  # a new flow reads the prefix as it is now
        steps = msg.loop.max_iters if msg.loop is not None and msg.loop.max_iters else DEFAULT_STEPS
        inputs = {k: core.store.resolve(v) for k, v in msg.inputs.items()}
        seq = core.new_sequence(msg, owner)
        try:
            seq.flow = make_flow_state(inputs, module.action_horizon, module.action_dim, steps, seq.generator)
        except Exception:
            core.scheduler.drop(seq)
            raise
        seq.request_id = msg.request_id
        seq.call = ActiveCall(msg, reply, context_before=len(seq.token_ids))
        seq.status = SeqStatus.RUNNING if seq.table.blocks else SeqStatus.WAITING

    def step(self) -> int:
        """One batched flow evaluation over every flow ready to step; returns how many."""
        if not self.has_work():
            return 0
        with self.core.busy():
            ready = self._reserve()
            if not ready:
                return 0
            velocity = self._evaluate(ready)
            for seq, v in zip(ready, velocity):
                seq.flow.advance(v)
                if seq.flow.done:
                    self._finish(seq)
            return len(ready)

    def _reserve(self) -> list[Sequence]:
        """The flows that step now, their H suffix slots reserved (once; oldest first, younger flows wait)."""
        core = self.core
        horizon = core.module.action_horizon
        ready: list[Sequence] = []
        for seq in sorted(self._active(), key=lambda s: s.arrival)[: core.config.max_num_seqs]:
            if not seq.flow.reserved:
                if not core.scheduler.make_room(seq, horizon, []) or seq.num_pending:
                    break
                core.cache.copy_blocks(core.blocks.append(seq.table, horizon))
                seq.flow.reserved = True
            ready.append(seq)
        return ready

    def _evaluate(self, ready: list[Sequence]) -> torch.Tensor:
        core = self.core
        meta, positions = flow_metadata(ready, core.blocks, core.module.action_horizon, core.device)
        core.backend.plan(meta)
        x = torch.stack([s.flow.x for s in ready]).to(core.device)
        t = torch.tensor([s.flow.t for s in ready], dtype=torch.float32, device=core.device)
        started = time.perf_counter()
        with torch.inference_mode():
            velocity = core.module.flow_velocity(x, t, positions, self.attn).float().cpu()
        core.runner.forward_seconds += time.perf_counter() - started
        self.evaluations += 1
        return velocity

    def _finish(self, seq: Sequence) -> None:
        call, seq.call = seq.call, None
        actions = seq.flow.x
        seq.flow, seq.status = None, SeqStatus.IDLE
        self.core.scheduler.drop(seq)  # the suffix slots and the fork go; the prefix view keeps its KV
        if not torch.isfinite(actions).all():
            call.reply(
                NodeOutput(
                    call.msg.call_id,
                    call.msg.request_id,
                    call.iteration,
                    final=True,
                    error=f"node {call.msg.node!r}: the flow produced NaN or infinite actions",
                )
            )
            return
        handle = self.core.store.put(actions, owner=call.msg.request_id)
        call.reply(
            NodeOutput(
                call.msg.call_id, call.msg.request_id, call.iteration, {"x": handle}, final=True, finish_reason="done"
            )
        )
