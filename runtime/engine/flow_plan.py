"""What a flow module tells the engine about one flow call, and what each batched evaluation is.

Two contracts run a flow Loop (mstar.engine.flow_loop):

- **Fixed** (pi0.5's): the module has ``action_horizon`` and ``action_dim``; every call integrates a
  state ``[action_horizon, action_dim]`` over ``action_horizon`` suffix rows with uniform times
  ``t_i = 1 - i / steps`` (``steps``: the Loop's ``max_iters``), and
  ``flow_velocity(x [B, H, A], t [B], positions [B * H], attn) -> [B, H, A]``.
- **Planned** (:class:`FlowModule`): the module has ``flow_plan``, which gives each call its own rows,
  state shape, time schedule and number of guidance branches (classifier-free guidance: each
  branch evaluates the same rows over the KV of another view, and the module combines their
  velocities before the Euler step). The Loop's ``max_iters`` is not used: the plan's timesteps
  say how many evaluations run.

A planned call may report its progress (``FlowPlan.report_every`` / ``predict_steps``): after the
chosen steps the flow sends a non-final output with its state (mstar.engine.flow_reports), so a graph
edge from the flow node's ``x_step`` / ``step`` / ``x_pred`` ports streams it on while the flow runs.

A **velocity call** (``LoopMode.VELOCITY``, planned modules only) runs one evaluation and takes no
step: the velocity at its input ``x`` and the plan's time ``t_step`` (input ``step``, default 0) over
the KV of its ``kv_from`` view alone (an empty context if the view has none), replied as ``v``. A
Walk that calls one velocity node per view (each on the Worker holding that view's KV) and then a
node that combines them and steps runs the same flow with its views on different Workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:  # a leaf at import time: models and the engine both import this module
    from mstar.engine.attention.backend import AttentionContext


@dataclass(frozen=True)
class FlowPlan:
    """One flow call's shape and schedule, from ``FlowModule.flow_plan``."""

    rows: int  # suffix rows each branch evaluates (KV slots reserved per branch)
    state_shape: tuple[int, ...]  # shape of the flow state x, e.g. (N, 64)
    timesteps: torch.Tensor  # [S+1] float32: t_0 (noise) .. t_S (data); S evaluations; x += (t_{i+1} - t_i) * v
    branches: int = 1  # 1 (main, the node's kv_from view) + guidance views used by this call
    report_every: int = 0  # > 0: report the state after every k-th step and after the last (0: never)
    predict_steps: tuple[int, ...] = ()  # steps (1..S) whose report also predicts the end state (x_pred)


@dataclass(frozen=True)
class FlowEval:
    """One row-block of a batched evaluation, in batch order."""

    inputs: Mapping[str, torch.Tensor]  # the flow call's inputs
    plan: FlowPlan
    branch: int  # 0: main; i > 0: the i-th guidance view
    step: int  # evaluation index 0..S-1


@runtime_checkable
class FlowModule(Protocol):
    """A planned flow module (an ``ARModule`` with these methods).

    Per engine step the engine evaluates every ready (flow, active branch) pair of the same state
    shape in ONE ``flow_velocity`` call: ``x [B, *state]`` (each pair's flow state), ``t [B]`` (its
    ``t_step``), ``positions`` [sum of the pairs' rows] and ``evals`` (B entries, in batch order; the
    rows of pair i are the i-th block of ``plan.rows`` rows). Branch b's rows sit after that
    branch's KV (the main view's fork, a guidance view's fork, or nothing for a guidance view
    without a sequence yet: an empty context) and see all of it plus each other; their positions
    start at the branch's next rope position (the largest explicit rope position + 1 if its
    sequence was given ``rope_positions``, else its next KV position) and count up by one per
    row: a module whose rows share one position uses only the first. Then, per flow,
    ``flow_combine`` turns the branches' velocities into one and the engine takes the Euler step
    ``x += (t_{i+1} - t_i) * v``.
    """

    def flow_plan(self, inputs: Mapping[str, torch.Tensor]) -> FlowPlan:
        """The call's plan from its inputs (raise ValueError naming a bad input)."""
        ...

    def flow_branches(self, inputs: Mapping[str, torch.Tensor], step: int, t: float) -> list[bool]:
        """Which of the plan's branches evaluation ``step`` (at time ``t``) needs; ``[0]`` is True.
        Optional when the plan has one branch."""
        ...

    def flow_velocity(
        self, x: torch.Tensor, t: torch.Tensor, positions: torch.Tensor, attn: AttentionContext, evals: list[FlowEval]
    ) -> torch.Tensor:
        """x [B, *state], t [B], positions [sum of rows] -> velocity [B, *state]."""
        ...

    def flow_combine(
        self, velocities: list[torch.Tensor | None], inputs: Mapping[str, torch.Tensor], step: int, t: float
    ) -> torch.Tensor:
        """One velocity [*state] from the branches' (None: a branch not evaluated at this step).
        Optional when the plan has one branch."""
        ...


def uniform_plan(rows: int, state_shape: tuple[int, ...], steps: int) -> FlowPlan:
    """The fixed contract's plan: ``steps`` uniform steps from t = 1 to t = 0, one branch."""
    times = torch.tensor([1.0 - i / steps for i in range(steps + 1)], dtype=torch.float32)
    return FlowPlan(rows=rows, state_shape=tuple(state_shape), timesteps=times)


def velocity_plan(plan: object, node: str, step: torch.Tensor | None) -> tuple[FlowPlan, int]:
    """A velocity call's plan (one branch: the call's own view) and its step; ValueError names a bad one."""
    if isinstance(plan, FlowPlan):
        plan = FlowPlan(plan.rows, plan.state_shape, plan.timesteps, branches=1)
    plan = check_plan(plan, node, guidance=0)
    evaluations = plan.timesteps.numel() - 1
    if step is None:
        return plan, 0
    if step.numel() != 1 or step.is_floating_point() or step.is_complex():
        raise ValueError(
            f"node {node!r}: velocity input 'step' must be one integer, got {step.dtype} {tuple(step.shape)}"
        )
    index = int(step.reshape(-1)[0])
    if not 0 <= index < evaluations:
        raise ValueError(f"node {node!r}: velocity input 'step' is {index}; the plan has steps 0..{evaluations - 1}")
    return plan, index


def check_plan(plan: object, node: str, guidance: int) -> FlowPlan:
    """``plan`` if it is a sound FlowPlan for a node with ``guidance`` guidance views; else ValueError."""
    where = f"node {node!r}: flow_plan"
    if not isinstance(plan, FlowPlan):
        raise ValueError(f"{where} must return a FlowPlan, got {type(plan).__name__}")
    if not isinstance(plan.rows, int) or plan.rows < 1:
        raise ValueError(f"{where} gave rows={plan.rows!r}; each branch needs at least one row")
    shape = tuple(plan.state_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ValueError(f"{where} gave state_shape={plan.state_shape!r}; it needs positive integer sizes")
    times = plan.timesteps
    if not isinstance(times, torch.Tensor) or times.dim() != 1 or times.numel() < 2:
        got = tuple(times.shape) if isinstance(times, torch.Tensor) else type(times).__name__
        raise ValueError(f"{where} gave timesteps {got}; it needs a 1-D tensor [S+1] with S >= 1")
    if not torch.isfinite(times).all():
        raise ValueError(f"{where} gave timesteps with NaN or infinite values")
    if not isinstance(plan.branches, int) or not 1 <= plan.branches <= 1 + guidance:
        raise ValueError(
            f"{where} asks for {plan.branches!r} branches; the node has the main view and {guidance} guidance views"
        )
    every = plan.report_every
    if not isinstance(every, int) or isinstance(every, bool) or every < 0:
        raise ValueError(f"{where} gave report_every={every!r}; it needs an integer >= 0 (0: no reports)")
    steps = times.numel() - 1
    predict = tuple(plan.predict_steps)
    if not all(isinstance(k, int) and 1 <= k <= steps for k in predict):
        raise ValueError(f"{where} gave predict_steps={predict!r}; each must be a step in 1..{steps}")
    return FlowPlan(plan.rows, shape, times.detach().float().cpu(), plan.branches, every, tuple(sorted(set(predict))))
