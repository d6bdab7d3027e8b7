"""One flow call's state: its plan, the integrated state x, the step, and its branches' sequences.

Every branch sequence of a flow (the main fork of ``kv_from`` first, then one per guidance view)
points at the same FlowState, so the scheduler and the loops see any of them as part of the flow.

Inpainting (real-time chunking): with inputs ``guide`` [*state] and ``guide_weights`` [state[0]]
the state is pulled, after every step, toward the guide noised to the new time
(``t * noise + (1 - t) * guide``) by the weights, so a chunk's first actions agree with the ones a
robot executes while the chunk is computed and the seam is smooth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mstar.engine.flow_plan import FlowPlan

if TYPE_CHECKING:
    from mstar.engine.sequence import Sequence


@dataclass
class FlowState:
    x: torch.Tensor  # [*state] float32, the state at time ``t``
    noise: torch.Tensor  # [*state], x at t_0
    plan: FlowPlan
    inputs: Mapping[str, torch.Tensor]  # the call's inputs (what the module's hooks read)
    times: list[float]  # t_0 .. t_S
    deltas: list[float]  # t_{i+1} - t_i of each evaluation
    planned: bool  # the module has flow_plan (mstar.engine.flow_plan); else the fixed contract
    guide: torch.Tensor | None = None
    weights: torch.Tensor | None = None  # [state[0], 1, ...]
    step: int = 0
    reserved: bool = False  # every branch's suffix slots are in its table
    branches: list[Sequence] = field(default_factory=list)  # [0]: the main one, which holds the call
    error: str | None = None  # a branch sequence failed (its prefix could not be recomputed): the flow fails
    velocity_only: bool = False  # a velocity call: evaluate at ``step`` once and reply v (LoopMode.VELOCITY)

    @property
    def main(self) -> Sequence:
        return self.branches[0]

    @property
    def t(self) -> float:
        return self.times[self.step]

    @property
    def dt(self) -> float:
        return self.deltas[self.step]

    def advance(self, velocity: torch.Tensor) -> None:
        self.x = self.x + self.dt * velocity.float()
        self.step += 1
        if self.guide is not None and self.weights is not None:
            t = self.t
            target = t * self.noise + (1.0 - t) * self.guide
            self.x = self.weights * target + (1.0 - self.weights) * self.x

    @property
    def done(self) -> bool:
        return self.step >= len(self.deltas)


def fixed_deltas(steps: int) -> list[float]:
    """The fixed contract's step, -1 / steps, as it always was (bit for bit)."""
    return [-1.0 / steps] * steps


def planned_deltas(times: torch.Tensor) -> list[float]:
    """t_{i+1} - t_i in float32 (a reference that computes x - v * (t_i - t_{i+1}) gets the same bits)."""
    return (times[1:] - times[:-1]).tolist()


def make_flow_state(
    inputs: Mapping[str, torch.Tensor], plan: FlowPlan, planned: bool, generator: torch.Generator | None
) -> FlowState:
    """The flow's start from the call's inputs; errors name the bad input."""
    shape = tuple(plan.state_shape)
    noise = inputs.get("x")
    if noise is None:  # no noise given: draw it from the request's seeded generator
        noise = torch.randn(shape, generator=generator)
    noise = noise.float().reshape(shape) if noise.numel() == plan_numel(shape) else noise
    if tuple(noise.shape) != shape:
        raise ValueError(f"flow input 'x' (noise) has shape {tuple(noise.shape)}, the model needs {shape}")
    if not torch.isfinite(noise).all():
        raise ValueError("flow input 'x' (noise) has NaN or infinite values")
    guide, weights = inputs.get("guide"), inputs.get("guide_weights")
    if (guide is None) != (weights is None):
        raise ValueError("flow inputs 'guide' and 'guide_weights' come together")
    if guide is not None:
        guide, weights = guide.float(), weights.float().reshape(-1)
        if tuple(guide.shape) != shape or weights.shape[0] != shape[0]:
            raise ValueError(
                f"flow 'guide' must be {shape} and 'guide_weights' ({shape[0]},); got "
                f"{tuple(guide.shape)} and {tuple(weights.shape)}"
            )
        if not (torch.isfinite(guide).all() and torch.isfinite(weights).all()):
            raise ValueError("flow 'guide' or 'guide_weights' has NaN or infinite values")
        weights = weights.clamp(0.0, 1.0).reshape(shape[0], *([1] * (len(shape) - 1)))
    if planned:
        times, deltas = plan.timesteps.tolist(), planned_deltas(plan.timesteps)
    else:  # as it always was, in Python floats: t_i = 1 - i / steps
        steps = plan.timesteps.numel() - 1
        times, deltas = [1.0 - i / steps for i in range(steps + 1)], fixed_deltas(steps)
    return FlowState(
        x=noise.clone(),
        noise=noise,
        plan=plan,
        inputs=inputs,
        times=times,
        deltas=deltas,
        planned=planned,
        guide=guide,
        weights=weights,
    )


def plan_numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
