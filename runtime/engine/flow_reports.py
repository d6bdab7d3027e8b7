"""A flow call's progress reports: after the steps its plan chose, the state so far on output ports.

A report (``FlowPlan.report_every`` / ``predict_steps``) is a non-final NodeOutput of the call with:

- ``x_step`` [*state] float32: the state after the step (after the last step it equals the final ``x``);
- ``step``: int64 scalar, the steps done so far (1..S);
- ``x_pred`` [*state] (only after a step in ``predict_steps``): the end state the step's velocity points
  at, ``x + (t_S - t) * v`` - one Euler step from here to the end of the schedule. For a flow from
  noise (t_0) to data (t_S = 0) that is the predicted clean sample ``x - t * v``: what a preview shows.

The last step's report rides on the call's final output, beside ``x``, so a consumer of ``x_step``
sees every chosen step, the last included, and the final output of a call without reports is as it
always was.
"""

from __future__ import annotations

import torch

from mstar.engine.flow_plan import FlowPlan
from mstar.engine.flow_state import FlowState


def reports_after(plan: FlowPlan, step: int, steps: int) -> bool:
    """Whether the flow reports after ``step`` (1-based steps done) of its ``steps``."""
    every = plan.report_every
    if every > 0 and (step % every == 0 or step == steps):
        return True
    return step in plan.predict_steps


def step_report(flow: FlowState, velocity: torch.Tensor) -> dict[str, torch.Tensor]:
    """The report after the step ``flow`` just took with ``velocity`` (empty: this step reports nothing)."""
    steps = len(flow.deltas)
    if not reports_after(flow.plan, flow.step, steps):
        return {}
    out = {"x_step": flow.x.clone(), "step": torch.tensor(flow.step, dtype=torch.long)}
    if flow.step in flow.plan.predict_steps:
        out["x_pred"] = flow.x + (flow.times[-1] - flow.t) * velocity.float()
    return out
