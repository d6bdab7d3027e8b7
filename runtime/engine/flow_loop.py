"""Flow-matching Loops in the AR engine: Euler steps of a continuous state over persisted KV.

A flow node (``GraphNode(..., engine="ar", loop_mode=LoopMode.FLOW, kv_from=PREFIX)``) forks the KV
its prefix view computed once (copy-on-write: the prefix is never recomputed per step) and
reserves its suffix rows' slots once. Every iteration the module's ``flow_velocity`` evaluates the
suffix - writing the suffix K/V into the same reserved slots - and the engine takes an Euler step
``x += dt * v`` from t_0 (noise) to t_S (data). The flows of every sequence in a flow Loop share
one batched evaluation per engine step, whatever their step.

A module with ``flow_plan`` (mstar.engine.flow_plan) sets each call's rows, state shape and time
schedule, and may use guidance views (``GraphNode.guidance``): each is one more KV branch of the
flow (mstar.engine.flow_branches) whose rows are evaluated in the same module call as every other
ready (flow, branch) pair; ``flow_branches`` says which branches a step needs and
``flow_combine`` merges their velocities before the Euler step. A module without it keeps the
fixed contract (pi0.5: ``action_horizon`` rows, uniform steps, one branch). A planned call may ask
for progress reports after chosen steps (mstar.engine.flow_reports): non-final outputs on the ports
``x_step``, ``step`` and ``x_pred``; the final ``x`` is the same either way.

A velocity call (``LoopMode.VELOCITY``, mstar.engine.flow_plan) is a one-evaluation flow over its own
view: it joins the same batched evaluation as every other ready flow, then replies ``v`` and goes.
"""

from __future__ import annotations

import time

import torch

from mstar.engine.attention.backend import AttentionContext
from mstar.engine.engine_core import EngineCore
from mstar.engine.engine_inbox import Reply
from mstar.engine.flow_branches import check_fits, evaluation_metadata, fork_branches
from mstar.engine.flow_plan import FlowEval, FlowPlan, check_plan, uniform_plan, velocity_plan
from mstar.engine.flow_reports import step_report
from mstar.engine.flow_state import FlowState, make_flow_state
from mstar.engine.loop_contract import CallRefused, EngineLoop
from mstar.engine.messages import ExecuteNode, NodeOutput
from mstar.engine.sequence import ActiveCall, SeqStatus, Sequence
from mstar.graph.loop_mode import LoopMode
from mstar.priority import Priority

DEFAULT_STEPS = 10


def _is_flow(seq: Sequence) -> bool:
    return seq.flow is not None


class FlowLoop(EngineLoop):
    """The AR engine's flow calls: started by ``start``, advanced one batched Euler step per ``step``.
    Their branch sequences live in the core's scheduler, which recomputes a preempted prefix."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.attn = AttentionContext(core.backend)
        self.evaluations = 0  # flow_velocity calls (one per state shape per engine step)
        self.branch_evaluations = 0  # (flow, branch) pairs those calls evaluated
        self.euler_steps = 0  # flow steps taken
        self.velocity_calls = 0  # velocity calls answered (LoopMode.VELOCITY)

    # -- the flows ------------------------------------------------------------------------------
    def _flows(self) -> list[FlowState]:
        """Every flow with a call in flight, most urgent class first, oldest first within one."""
        flows = [
            s.flow
            for s in self.core.scheduler.seqs.values()
            if s.flow is not None and s is s.flow.main and s.call is not None
        ]
        return sorted(flows, key=lambda f: self.core.scheduler.order_key(f.main))

    @staticmethod
    def _computed(flow: FlowState) -> bool:
        """Every branch's context is in the KV (none waits for a recompute)."""
        return all(b.num_pending == 0 and b.call is not None for b in flow.branches)

    def has_work(self) -> bool:
        return any(self._computed(f) for f in self._flows())

    def _within(self, flow: FlowState, limit: Priority | None) -> bool:
        return limit is None or self.core.scheduler.class_of(flow.main) <= limit

    def most_urgent(self) -> Priority | None:
        """The most urgent class among flows that may step now (None: none may)."""
        return min((self.core.scheduler.class_of(f.main) for f in self._flows() if self._computed(f)), default=None)

    def stats(self) -> dict[str, int]:
        return {
            "flow_calls": self.evaluations,
            "flow_evaluations": self.branch_evaluations,
            "flow_steps": self.euler_steps,
            "flow_velocity_calls": self.velocity_calls,
        }

    # -- the contract's bookkeeping ----------------------------------------------------------------
    def _drop(self, flow: FlowState) -> None:
        for seq in flow.branches:
            seq.flow, seq.call, seq.status = None, None, SeqStatus.IDLE
            self.core.scheduler.drop(seq)  # the suffix slots and the forks go; the views keep their KV

    def _fail(self, flow: FlowState, error: str) -> None:
        self.core.fail_call(flow.main, error)
        self._drop(flow)

    def _owned(self, pick) -> list[FlowState]:
        seen: dict[int, FlowState] = {}
        for seq in self.core.scheduler.seqs.values():
            if seq.flow is not None and pick(seq):
                seen.setdefault(id(seq.flow), seq.flow)
        return list(seen.values())

    def release(self, request_id: str) -> None:
        """A flow keeps nothing for a session (its KV is a fork): every branch of the request's flows goes."""
        for flow in self._owned(lambda s: s.request_id == request_id):
            self._drop(flow)

    def close_session(self, session_id: str) -> None:
        for flow in self._owned(lambda s: s.owner == session_id):
            self._fail(flow, f"session {session_id!r} was closed")

    def fail_all(self, error: Exception) -> None:
        """Every flow in flight fails and goes (its suffix slots may be half-written)."""
        for flow in self._owned(lambda s: True):
            self._fail(flow, f"flow step failed: {type(error).__name__}: {error}")

    def _sweep(self) -> None:
        """Flows that lost a branch (a failed recompute) or their call fail or go as a whole."""
        for flow in self._owned(lambda s: True):
            if flow.main.call is None:
                self._drop(flow)
            elif flow.error is not None or any(b.call is None for b in flow.branches):
                self._fail(flow, flow.error or f"node {flow.main.node!r}: a guidance branch of the flow failed")

    # -- start -------------------------------------------------------------------------------------
    def start(self, msg: ExecuteNode, reply: Reply) -> None:
        """Validates a flow call and forks one sequence per branch from its views' KV."""
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
        for old in self._owned(lambda s: s.owner == owner and s.flow.main.node == msg.node):
            if old.main.call is not None:
                raise ValueError(f"node {msg.node!r} already has a call in flight for {owner!r}")
            self._drop(old)
        stale = core.scheduler.seqs.get((owner, msg.node))
        if stale is not None:  # a flow sequence left from before (its call ended elsewhere)
            core.scheduler.drop(stale)
        inputs = {k: core.store.resolve(v) for k, v in msg.inputs.items()}
        velocity = LoopMode.parse(msg.loop_mode) is LoopMode.VELOCITY
        if velocity:
            plan, step = self._velocity_plan(msg, inputs)
            planned = True
            branches = [core.new_sequence(msg, owner, empty_ok=True)]  # its view alone, maybe an empty context
        else:
            plan, planned = self._plan(msg, inputs)
            branches = fork_branches(core, msg, owner, plan.branches)
        try:
            check_fits(core, msg.node, branches, plan.rows)
            flow = make_flow_state(inputs, plan, planned, branches[0].generator)
        except Exception:
            for seq in branches:
                core.scheduler.drop(seq)
            raise
        if velocity:
            flow.step, flow.velocity_only = step, True
        flow.branches = branches
        for i, seq in enumerate(branches):
            seq.flow = flow
            seq.request_id = msg.request_id
            # a branch's call only lets the scheduler recompute its context; its errors fail the flow
            seq.call = ActiveCall(msg, reply if i == 0 else _branch_reply(flow), context_before=len(seq.token_ids))
            seq.status = SeqStatus.RUNNING if seq.table.blocks else SeqStatus.WAITING

    def _velocity_plan(self, msg: ExecuteNode, inputs: dict[str, torch.Tensor]) -> tuple[FlowPlan, int]:
        """A velocity call's one-branch plan and the step it evaluates."""
        module = self.core.module
        if not hasattr(module, "flow_plan"):
            raise ValueError(
                f"velocity node {msg.node!r}: module {type(module).__name__} has no flow_plan (velocity calls need "
                f"a planned flow module)"
            )
        if "x" not in inputs:
            raise ValueError(f"velocity node {msg.node!r}: input 'x' (the state to evaluate at) is missing")
        return velocity_plan(module.flow_plan(inputs), msg.node, inputs.get("step"))

    def _plan(self, msg: ExecuteNode, inputs: dict[str, torch.Tensor]) -> tuple[FlowPlan, bool]:
        """The call's plan (from ``flow_plan``, or the fixed contract's), and whether the module plans."""
        module = self.core.module
        if not hasattr(module, "flow_plan"):
            if msg.guidance:
                raise ValueError(
                    f"node {msg.node!r} has guidance views but module {type(module).__name__} has no flow_plan"
                )
            steps = msg.loop.max_iters if msg.loop is not None and msg.loop.max_iters else DEFAULT_STEPS
            rows, dim = module.action_horizon, module.action_dim
            return uniform_plan(rows, (rows, dim), steps), False
        plan = check_plan(module.flow_plan(inputs), msg.node, len(msg.guidance))
        if plan.branches > 1 and not (hasattr(module, "flow_branches") and hasattr(module, "flow_combine")):
            raise ValueError(
                f"node {msg.node!r}: a flow with {plan.branches} branches needs the module's flow_branches and "
                f"flow_combine ({type(module).__name__} lacks one)"
            )
        return plan, True

    # -- step --------------------------------------------------------------------------------------
    def step(self, limit: Priority | None = None) -> int:
        """One batched evaluation of every ready (flow, branch) pair whose flow is of class ``limit`` or
        more urgent (None: every one); returns how many flows stepped."""
        self._sweep()
        if not self.has_work():
            return 0
        with self.core.busy():
            ready = self._reserve(limit)
            pairs = [(flow, b) for flow in ready for b in self._branches_now(flow)]
            velocities = self._evaluate(pairs)
            stepped = 0
            for flow in ready:
                if flow.main.call is None:  # failed while choosing its branches
                    continue
                if flow.velocity_only:
                    self._reply_velocity(flow, velocities[id(flow)][0])
                    stepped += 1
                    continue
                try:
                    v = self._combine(flow, velocities.get(id(flow), {}))
                except Exception as exc:  # this flow's mistake: the others go on
                    self._fail(flow, f"node {flow.main.node!r}: flow_combine failed: {type(exc).__name__}: {exc}")
                    continue
                flow.advance(v)
                self.euler_steps += 1
                stepped += 1
                report = step_report(flow, v)
                if flow.done:
                    self._finish(flow, report)
                elif report:
                    self._report(flow, report)
            return stepped

    def _reserve(self, limit: Priority | None = None) -> list[FlowState]:
        """The flows of class ``limit`` or more urgent that step now, every branch's suffix slots
        reserved (once, for all branches or none; oldest first, younger flows wait)."""
        core = self.core
        ready: list[FlowState] = []
        due = [f for f in self._flows() if self._computed(f) and self._within(f, limit)]
        for flow in due[: core.config.max_num_seqs]:
            if not flow.reserved:
                if not core.scheduler.make_room_all(flow.branches, flow.plan.rows) or not self._computed(flow):
                    break
                for seq in flow.branches:
                    core.cache.copy_blocks(core.blocks.append(seq.table, flow.plan.rows))
                flow.reserved = True
            ready.append(flow)
        return ready

    def _branches_now(self, flow: FlowState) -> list[int]:
        """The branches ``flow`` evaluates at its current step (``flow_branches``; all of one)."""
        if flow.plan.branches == 1:
            return [0]
        module = self.core.module
        try:
            wanted = list(module.flow_branches(flow.inputs, flow.step, flow.t))
            if len(wanted) != flow.plan.branches or not wanted[0]:
                raise ValueError(
                    f"it must give {flow.plan.branches} flags (one per branch) with the first True, got {wanted}"
                )
        except Exception as exc:
            self._fail(flow, f"node {flow.main.node!r}: flow_branches failed: {type(exc).__name__}: {exc}")
            return []
        return [b for b, on in enumerate(wanted) if on]

    def _evaluate(self, pairs: list[tuple[FlowState, int]]) -> dict[int, dict[int, torch.Tensor]]:
        """Velocities of every pair, by flow and branch: one module call per state shape."""
        by_shape: dict[tuple[int, ...], list[tuple[FlowState, int]]] = {}
        for flow, b in pairs:
            by_shape.setdefault(flow.plan.state_shape, []).append((flow, b))
        out: dict[int, dict[int, torch.Tensor]] = {}
        for group in by_shape.values():
            velocity = self._call_module(group)
            for (flow, b), v in zip(group, velocity):
                out.setdefault(id(flow), {})[b] = v
        return out

    def _call_module(self, group: list[tuple[FlowState, int]]) -> torch.Tensor:
        core = self.core
        seqs = [flow.branches[b] for flow, b in group]
        meta, positions = evaluation_metadata(seqs, [flow.plan.rows for flow, _ in group], core.blocks, core.device)
        core.backend.plan(meta)
        x = torch.stack([flow.x for flow, _ in group]).to(core.device)
        t = torch.tensor([flow.t for flow, _ in group], dtype=torch.float32, device=core.device)
        started = time.perf_counter()
        with torch.inference_mode():
            if group[0][0].planned:
                evals = [FlowEval(flow.inputs, flow.plan, b, flow.step) for flow, b in group]
                velocity = core.module.flow_velocity(x, t, positions, self.attn, evals)
            else:
                velocity = core.module.flow_velocity(x, t, positions, self.attn)
            velocity = velocity.float().cpu()
        core.runner.forward_seconds += time.perf_counter() - started
        if tuple(velocity.shape) != tuple(x.shape):
            raise ValueError(f"flow_velocity returned shape {tuple(velocity.shape)} for x of shape {tuple(x.shape)}")
        self.evaluations += 1
        self.branch_evaluations += len(group)
        return velocity

    def _combine(self, flow: FlowState, velocities: dict[int, torch.Tensor]) -> torch.Tensor:
        """The flow's velocity for its Euler step: the main branch's, or ``flow_combine`` of all."""
        if not flow.planned or not hasattr(self.core.module, "flow_combine"):
            return velocities[0]
        per_branch = [velocities.get(b) for b in range(flow.plan.branches)]
        v = self.core.module.flow_combine(per_branch, flow.inputs, flow.step, flow.t)
        v = torch.as_tensor(v).float().cpu()
        if tuple(v.shape) != flow.plan.state_shape:
            raise ValueError(f"it returned shape {tuple(v.shape)}, the flow state is {flow.plan.state_shape}")
        return v

    def _report(self, flow: FlowState, report: dict[str, torch.Tensor]) -> None:
        """A progress report of the running call (a non-final output; iteration: the step's index)."""
        call = flow.main.call
        assert call is not None
        owner = call.msg.request_id
        handles = {name: self.core.store.put(value, owner=owner) for name, value in report.items()}
        call.reply(NodeOutput(call.msg.call_id, owner, flow.step - 1, handles))

    def _reply_velocity(self, flow: FlowState, velocity: torch.Tensor) -> None:
        call = flow.main.call
        self._drop(flow)
        assert call is not None
        self.velocity_calls += 1
        msg = call.msg
        if not torch.isfinite(velocity).all():
            error = f"node {msg.node!r}: the velocity has NaN or infinite values"
            call.reply(NodeOutput(msg.call_id, msg.request_id, call.iteration, final=True, error=error))
            return
        handle = self.core.store.put(velocity, owner=msg.request_id)
        call.reply(
            NodeOutput(msg.call_id, msg.request_id, call.iteration, {"v": handle}, final=True, finish_reason="done")
        )

    def _finish(self, flow: FlowState, report: dict[str, torch.Tensor] | None = None) -> None:
        call = flow.main.call
        final = flow.x
        self._drop(flow)
        assert call is not None
        if not torch.isfinite(final).all():
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
        owner = call.msg.request_id
        outputs = {name: self.core.store.put(value, owner=owner) for name, value in (report or {}).items()}
        outputs["x"] = self.core.store.put(final, owner=owner)
        call.reply(NodeOutput(call.msg.call_id, owner, call.iteration, outputs, final=True, finish_reason="done"))


def _branch_reply(flow: FlowState) -> Reply:
    """A guidance branch's reply: its error (a recompute that can never fit) fails the whole flow."""

    def reply(out: NodeOutput) -> None:
        if out.error and flow.error is None:
            flow.error = out.error

    return reply
