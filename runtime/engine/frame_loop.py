"""World-model frame Loops in the AR engine: a persistent frame context, and rollouts over it.

A frame node (``GraphNode(..., engine="ar", loop_mode=LoopMode.FRAMES)``) runs a
:class:`~mstar.engine.frame_module.FrameModule`. Its rows come in frames; the engine's KV
block is one frame, and attention is block-causal (a frame sees itself and earlier frames),
so a computed frame's K/V never change again.

**Context view** (no ``kv_from``): a call with ``latents`` [F, *latent], ``states`` [F, S]
and ``actions`` [F, A] extends the context of its session (or request). A frame's action
token is the action taken *at* that frame, known only once the next frame's pose is, so the
newest frame stays *pending*: ``actions[0]`` is the pending frame's action (ignored when
there is none) and ``actions[i]`` that of ``latents[i - 1]``; ``latents[F - 1]`` becomes the
new pending frame. Each frame is computed once, and the context persists across calls.
The window (``kv_window`` frames, at most ``max_frames``, the pending one included) is kept
exactly: positions are absolute and the model's RoPE is not shift-invariant, so when a call
would overflow it the context keeps its newest half and computes it again from position 0
(what a full recompute over the kept frames gives).

**Rollout view** (``kv_from`` = the context view): a call with ``actions`` [S, H, A] runs S
rollouts of H frames. Each sample's table forks the context's (copy-on-write: every computed
frame's block is shared, none is recomputed); iteration 0 computes the pending frame (or the
``frame`` / ``state`` inputs) with ``actions[:, 0]``, iteration h the frame predicted at
iteration h - 1 with ``actions[:, h]`` and the state ``advance_state`` gives. Every rollout
sample and context extension in the engine shares one forward per step, up to
``max_batched_tokens`` rows (oldest calls first; a call's samples always step together). Outputs: ``frame``
[S, *latent] (the last prediction) and ``frames`` [S, H, *latent] with meta ``all_frames=1``.
"""

from __future__ import annotations

import time

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.attention.metadata import AttentionMetadata, MaskKind, SeqAttention
from mstar.engine.block_manager import BlockTable
from mstar.engine.engine_core import EngineCore
from mstar.engine.engine_inbox import Reply
from mstar.engine.frame_module import FrameModule
from mstar.engine.frame_state import Frame, FrameContext, Rollout, finite_input, shape_error
from mstar.engine.loop_contract import CallRefused, EngineLoop
from mstar.engine.messages import ExecuteNode, NodeOutput
from mstar.engine.sequence import ActiveCall
from mstar.engine.serve_order import call_class, serve_key
from mstar.priority import Priority


class FrameLoop(EngineLoop):
    """The AR engine's frame calls: contexts and rollouts, one batched forward per ``step``."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.attn = AttentionContext(core.backend)
        self.contexts: dict[tuple[str, str], FrameContext] = {}
        self.rollouts: dict[tuple[str, str], Rollout] = {}
        self.frames_computed = 0
        self.forwards = 0
        self._stepping: list = []  # the items of a forward in progress (for fail_all)

    # -- bookkeeping ------------------------------------------------------------------
    @property
    def module(self) -> FrameModule:
        return self.core.module  # type: ignore[return-value]  # start() admits frame calls of a FrameModule only

    def has_work(self) -> bool:
        return any(c.call is not None for c in self.contexts.values()) or bool(self.rollouts)

    def most_urgent(self) -> Priority | None:
        """The most urgent class among contexts and rollouts with a call in flight (None: none)."""
        calls = [c.call for c in self.contexts.values() if c.call is not None] + [
            r.call for r in self.rollouts.values()
        ]
        return min((call_class(c.msg, self.core.config.priority_classes) for c in calls), default=None)

    def stats(self) -> dict[str, int]:
        if not isinstance(self.core.module, FrameModule):
            return {}
        return {
            "frame_contexts": len(self.contexts),
            "rollouts": len(self.rollouts),
            "context_blocks": sum(len(c.table.blocks) for c in self.contexts.values()),
            "frames_computed": self.frames_computed,
            "frame_forwards": self.forwards,
            "window_slides": sum(c.slides for c in self.contexts.values()),
        }

    def context(self, owner: str, node: str) -> FrameContext | None:
        return self.contexts.get((owner, node))

    def _reply(self, call: ActiveCall, outputs: dict | None = None, error: str | None = None) -> None:
        m = call.msg
        call.reply(
            NodeOutput(
                m.call_id,
                m.request_id,
                call.iteration,
                outputs or {},
                final=True,
                finish_reason=None if error else "done",
                error=error,
            )
        )

    def _drop_rollout(self, key: tuple[str, str], error: str | None = None) -> None:
        r = self.rollouts.pop(key)
        for table in r.tables:
            self.core.blocks.free(table)
        r.tables = []
        if error is not None:
            self._reply(r.call, error=error)

    def _drop_context(self, key: tuple[str, str], error: str | None = None) -> None:
        c = self.contexts.pop(key)
        self.core.blocks.free(c.table)
        if c.call is not None and error is not None:
            self._reply(c.call, error=error)

    def close_session(self, owner: str) -> None:
        for key in [k for k in self.rollouts if k[0] == owner]:
            self._drop_rollout(key, f"session {owner!r} was closed")
        for key in [k for k in self.contexts if k[0] == owner]:
            self._drop_context(key, f"session {owner!r} was closed")

    def release(self, request_id: str) -> None:
        """The Conductor let go of a request: its rollouts and its own contexts go; a session
        context drops the abandoned call's frames and keeps what it had computed."""
        for key in [k for k, r in self.rollouts.items() if r.request_id == request_id]:
            self._drop_rollout(key)
        for key, c in list(self.contexts.items()):
            if c.request_id != request_id:
                continue
            if c.owner == request_id:
                self._drop_context(key)
            elif c.call is not None:
                c.call, c.todo, c.next_pending, c.rebuild = None, [], None, False

    def fail_all(self, error: Exception) -> None:
        """A forward failed: its rollouts fail and go; a context it was extending is dropped
        (its new blocks are half-written), so the session starts its context again."""
        text = f"frame step failed: {type(error).__name__}: {error}"
        stepping, self._stepping = self._stepping, []
        for w, _ in stepping:
            key = (w.owner, w.node)
            if isinstance(w, Rollout) and key in self.rollouts:
                self._drop_rollout(key, text)
            elif isinstance(w, FrameContext) and key in self.contexts:
                self._drop_context(key, text)

    # -- starting calls -----------------------------------------------------------------
    def start(self, msg: ExecuteNode, reply: Reply) -> None:
        core = self.core
        if not isinstance(core.module, FrameModule):
            raise CallRefused(
                f"node {msg.node!r} is a frame node but module {type(core.module).__name__} is no FrameModule"
            )
        if core.tp_leader is not None:
            raise CallRefused(f"frame node {msg.node!r}: frame Loops are not supported with tensor parallelism yet")
        owner = msg.session_id or msg.request_id
        key = (owner, msg.node)
        if key in self.rollouts or (key in self.contexts and self.contexts[key].call is not None):
            raise ValueError(f"node {msg.node!r} already has a call in flight for {owner!r}")
        inputs = {k: core.store.resolve(v) for k, v in msg.inputs.items()}
        call = ActiveCall(msg, reply)
        if msg.kv_from:
            self._start_rollout(msg, owner, inputs, call)
        else:
            self._start_context(msg, owner, inputs, call)

    def _start_context(self, msg: ExecuteNode, owner: str, inputs: dict, call: ActiveCall) -> None:
        m, node = self.module, msg.node
        latent_shape = tuple(m.latent_shape)
        for name in ("latents", "states", "actions"):
            if name not in inputs:
                raise ValueError(f"node {node!r}: a frame context call needs input {name!r}")
        latents, states, actions = (finite_input(node, n, inputs[n]) for n in ("latents", "states", "actions"))
        if latents.dim() == len(latent_shape):
            latents, states, actions = latents[None], states.reshape(1, -1), actions.reshape(1, -1)
        F = latents.shape[0]
        if tuple(latents.shape[1:]) != latent_shape or F == 0:
            raise shape_error(node, "latents", latents, f"[F >= 1, {', '.join(map(str, latent_shape))}]")
        if tuple(states.shape) != (F, m.state_dim):
            raise shape_error(node, "states", states, f"[{F}, {m.state_dim}]")
        if tuple(actions.shape) != (F, m.action_dim):
            raise shape_error(node, "actions", actions, f"[{F}, {m.action_dim}]")
        window = m.max_frames if msg.kv_window is None else int(msg.kv_window)
        if not 1 <= window <= m.max_frames:
            raise ValueError(
                f"node {node!r}: a frame window of {window} frames is outside [1, {m.max_frames}] "
                f"(the model's frame capacity)"
            )
        ctx = self.contexts.get((owner, node))
        if ctx is None:
            ctx = self.contexts[(owner, node)] = FrameContext(owner, node, msg.request_id)
        todo: list[Frame] = []
        if ctx.pending is not None:
            todo.append((ctx.pending[0], actions[0], ctx.pending[1]))
        todo.extend((latents[i], actions[i + 1], states[i]) for i in range(F - 1))
        ctx.request_id, ctx.call, ctx.window = msg.request_id, call, window
        ctx.next_pending = (latents[F - 1], states[F - 1])
        ctx.arrival = time.monotonic()
        if ctx.num_frames + len(todo) + 1 > window:  # slide: keep the newest half, exactly
            keep = max(1, window // 2) - 1
            frames = (ctx.computed + todo)[len(ctx.computed) + len(todo) - keep :] if keep else []
            ctx.todo, ctx.rebuild = frames, True
        else:
            ctx.todo, ctx.rebuild = todo, False

    def _start_rollout(self, msg: ExecuteNode, owner: str, inputs: dict, call: ActiveCall) -> None:
        m, node = self.module, msg.node
        if "actions" not in inputs:
            raise ValueError(f"node {node!r}: a rollout call needs input 'actions' [samples, horizon, {m.action_dim}]")
        actions = finite_input(node, "actions", inputs["actions"])
        if actions.dim() == 2:
            actions = actions[None]
        if actions.dim() != 3 or actions.shape[2] != m.action_dim or actions.shape[0] < 1 or actions.shape[1] < 1:
            raise shape_error(node, "actions", actions, f"[samples, horizon, {m.action_dim}]")
        S, H = int(actions.shape[0]), int(actions.shape[1])
        if msg.loop is not None and msg.loop.max_iters is not None and msg.loop.max_iters != H:
            raise ValueError(
                f"node {node!r}: the Loop asks for {msg.loop.max_iters} rollout steps but 'actions' holds {H}"
            )
        frame = state = None
        if "frame" in inputs or "state" in inputs:
            if "frame" not in inputs or "state" not in inputs:
                raise ValueError(f"node {node!r}: rollout inputs 'frame' and 'state' come together")
            frame, state = finite_input(node, "frame", inputs["frame"]), finite_input(node, "state", inputs["state"])
            latent_shape = tuple(m.latent_shape)
            if tuple(frame.shape) == latent_shape:
                frame = frame[None].expand(S, *latent_shape)
            if tuple(frame.shape) != (S, *latent_shape):
                raise shape_error(node, "frame", frame, f"[{', '.join(map(str, latent_shape))}] or [{S}, ...]")
            state = state.reshape(-1, m.state_dim).expand(S, m.state_dim) if state.numel() == m.state_dim else state
            if tuple(state.shape) != (S, m.state_dim):
                raise shape_error(node, "state", state, f"[{m.state_dim}] or [{S}, {m.state_dim}]")
        key = (owner, msg.kv_from)
        ctx = self.contexts.get(key)
        if frame is None and (ctx is None or (ctx.pending is None and ctx.next_pending is None)):
            raise ValueError(
                f"node {node!r}: no frame to roll out from: context {msg.kv_from!r} of {owner!r} "
                f"holds no frame yet, and no 'frame' / 'state' inputs were given"
            )
        self.rollouts[(owner, node)] = Rollout(
            owner,
            node,
            msg.request_id,
            call,
            actions,
            frame,
            state,
            key if ctx is not None else None,
            all_frames=bool(msg.meta.get("all_frames", 0)),
        )

    # -- one batched step ---------------------------------------------------------------
    def _fork(self, r: Rollout) -> bool:
        """Forks the context for every sample and reserves every frame the rollout will compute
        (so an admitted rollout always finishes: no two rollouts can wait on each other's blocks).
        False while the context is being extended, or while rollouts in flight hold the blocks
        this one needs; ValueError when it cannot fit at all."""
        ctx = self.contexts.get(r.context_key) if r.context_key else None
        if ctx is not None and ctx.call is not None:
            return False  # wait: the rollout starts from the frames that call brings
        m, blocks, ft = self.module, self.core.blocks, self.module.frame_tokens
        if ctx is None and r.frame is None:
            raise ValueError(f"node {r.node!r}: context {r.context_key[1] if r.context_key else '?'!r} was closed")
        r.base = ctx.num_frames if ctx is not None else 0
        if r.base + r.horizon > m.max_frames:
            raise ValueError(
                f"node {r.node!r}: a rollout of {r.horizon} frames after {r.base} context frames needs "
                f"{r.base + r.horizon} frame positions; the model holds {m.max_frames} "
                f"(give the context a smaller window)"
            )
        need = r.samples * r.horizon
        if need > blocks.num_free_blocks:
            if self._rollouts_hold_blocks(r) or self.core.tokens_hold_blocks():
                return False  # they finish and free theirs: first come, first served
            raise ValueError(
                f"node {r.node!r}: {r.samples} samples x {r.horizon} frames need {need} KV frame blocks; "
                f"{blocks.num_free_blocks} of {blocks.num_blocks} are free (the sessions' contexts hold "
                f"the rest): size the pool for the windows plus samples x horizon"
            )
        if r.frame is None:
            latent, state = ctx.pending
            r.frame = latent[None].expand(r.samples, *latent.shape)
            r.state = state[None].expand(r.samples, state.shape[0])
        shared = ctx.table if ctx is not None and ctx.table.blocks else None
        r.tables = [blocks.fork(shared) if shared is not None else BlockTable() for _ in range(r.samples)]
        for table in r.tables:  # whole frames: a fork shares whole blocks, nothing to copy on write
            self.core.cache.copy_blocks(blocks.append(table, r.horizon * ft))
        r.started = True
        return True

    def step(self, limit: Priority | None = None) -> int:
        """One forward over every context extension and rollout frame ready; returns how many calls stepped
        (``limit`` is not applied inside it: the engine steps the loop only when its most urgent call is
        within the round's class)."""
        if not self.has_work():
            return 0
        items: list[tuple[object, list]] = []
        self._stepping = items  # what fail_all must undo if anything below raises (kept for it until then)
        with self.core.busy():
            finished = self._admit(items)
            if items:
                predictions = self._forward([p for _, parts in items for p in parts])
                offset = 0
                for w, parts in items:
                    n = sum(len(f) for _, f, _, _ in parts)
                    self._finish(w, parts, predictions[offset : offset + n])
                    offset += n
        self._stepping = []
        return finished + len(items)

    def _admit(self, items: list[tuple[object, list]]) -> int:
        """Adds to ``items`` the work of this step's forward, oldest call first, up to ``max_num_seqs``
        sequences and ``max_batched_tokens`` rows, its blocks reserved; returns how many calls finished
        without one (a new pending frame alone)."""
        core, ft = self.core, self.module.frame_tokens
        blocks = core.blocks
        finished = 0
        budget = core.config.max_num_seqs
        rows_left = core.config.max_batched_tokens  # a step's rows, as for token steps (the first item always fits)
        work = sorted(
            [c for c in self.contexts.values() if c.call is not None] + list(self.rollouts.values()),
            key=lambda w: serve_key(w.call.msg, w.arrival, core.config.priority_classes),
        )
        for w in work:
            if isinstance(w, Rollout):
                try:
                    if not w.started and not self._fork(w):
                        continue
                except ValueError as exc:
                    self._drop_rollout((w.owner, w.node), str(exc))
                    continue
            elif not w.todo and not w.rebuild:  # only a new pending frame: nothing to compute
                self._finish(w, [], torch.empty(0))
                finished += 1
                continue
            parts = self._parts(w)
            rows = sum(len(f) for _, f, _, _ in parts) * ft
            if items and (len(parts) > budget or rows > rows_left):
                break  # the next step takes it: on a CPU a bigger forward only costs more per row
            if isinstance(w, FrameContext):
                if w.rebuild:  # the kept frames, less the blocks that freeing this table returns
                    need = len(w.todo) - sum(blocks.ref_count(b) == 1 for b in w.table.blocks)
                else:
                    need = blocks.blocks_needed(w.table, len(w.todo) * ft)
                if need > blocks.num_free_blocks:
                    if self._rollouts_hold_blocks(None) or core.tokens_hold_blocks():
                        break  # rollouts in flight free theirs: younger calls wait (first come, first served)
                    self._fail(
                        w,
                        f"node {w.node!r}: the KV pool ({blocks.num_blocks} frame blocks, "
                        f"{blocks.num_free_blocks} free) cannot hold {need} more frames",
                    )
                    continue
                if w.rebuild:  # admitted: recomputed from position 0 (``todo`` holds the kept frames)
                    blocks.free(w.table)
                    w.computed = []
                    w.slides += 1
                    if not w.todo:
                        self._finish(w, [], torch.empty(0))
                        finished += 1
                        continue
                    parts = self._parts(w)
                core.cache.copy_blocks(blocks.append(w.table, len(w.todo) * ft))
            items.append((w, parts))
            budget -= len(parts)
            rows_left -= rows
            if budget <= 0 or rows_left <= 0:
                break
        return finished

    def _parts(self, w) -> list[tuple[BlockTable, list[Frame], int, int]]:
        """(table, frames computed now, first frame position, first table row) per sequence of a work item."""
        ft = self.module.frame_tokens
        if isinstance(w, FrameContext):
            first = 0 if w.rebuild else w.num_frames
            return [(w.table, w.todo, first, first * ft)]
        h = w.step
        acts = w.actions[:, h]
        return [(t, [(w.frame[s], acts[s], w.state[s])], w.base + h, (w.base + h) * ft) for s, t in enumerate(w.tables)]

    def _rollouts_hold_blocks(self, other_than) -> bool:
        """Whether rollouts in flight (which free their blocks when done) hold any; idle contexts never do."""
        return any(r.tables for r in self.rollouts.values() if r is not other_than)

    def _fail(self, w, error: str) -> None:
        if isinstance(w, Rollout):
            self._drop_rollout((w.owner, w.node), error)
        else:
            call, w.call, w.todo, w.next_pending, w.rebuild = w.call, None, [], None, False
            self._reply(call, error=error)

    def _forward(self, parts: list[tuple[BlockTable, list[Frame], int]]) -> torch.Tensor:
        core, m = self.core, self.module
        ft = m.frame_tokens
        seqs, slots, latents, actions, states, positions = [], [], [], [], [], []
        rows = 0
        for table, frames, first, start in parts:
            n = len(frames) * ft
            # a rollout's table has its later frames reserved: the context ends at this step's frame
            seqs.append(
                SeqAttention(
                    query_start=rows,
                    query_len=n,
                    context_len=start + n,
                    block_table=list(table.blocks),
                    first_position=0,
                    mask=MaskKind.BLOCK_CAUSAL,
                    mask_arg=ft,
                )
            )
            slots.append(core.blocks.slot_mapping(table, start, start + n))
            for i, (latent, action, state) in enumerate(frames):
                latents.append(latent)
                actions.append(action)
                states.append(state)
                positions.append(first + i)
            rows += n
        meta = AttentionMetadata(seqs=seqs, slot_mapping=torch.cat(slots).to(core.device))
        core.backend.plan(meta)
        dtype = m.dtype if hasattr(m, "dtype") else torch.float32
        started = time.perf_counter()
        with torch.inference_mode():
            out = m.forward_frames(
                torch.stack(latents).to(core.device, dtype),
                torch.stack(actions).to(core.device, dtype),
                torch.stack(states).to(core.device, dtype),
                torch.tensor(positions, dtype=torch.int64, device=core.device),
                self.attn,
            )
        core.runner.forward_seconds += time.perf_counter() - started
        self.forwards += 1
        self.frames_computed += len(positions)
        return out.float().cpu()

    def _finish(self, w, parts, predictions: torch.Tensor) -> None:
        if isinstance(w, FrameContext):
            w.computed.extend(w.todo)
            w.pending, w.next_pending = w.next_pending, None
            call, w.call, w.todo, w.rebuild = w.call, None, [], False
            self._reply(call)
            return
        m = self.module
        if not torch.isfinite(predictions).all():
            self._drop_rollout((w.owner, w.node), f"node {w.node!r}: the rollout predicted NaN or infinite values")
            return
        acts = w.actions[:, w.step]
        w.state = m.advance_state(w.state.float(), acts).float()
        w.frame = predictions
        w.call.iteration = w.step
        w.step += 1
        if w.all_frames:
            w.outputs.append(predictions)
        if w.step < w.horizon:
            return
        store = self.core.store
        outputs = {"frame": store.put(predictions, owner=w.request_id)}
        if w.all_frames:
            outputs["frames"] = store.put(torch.stack(w.outputs, dim=1), owner=w.request_id)
        call = w.call
        self._drop_rollout((w.owner, w.node))
        self._reply(call, outputs)
