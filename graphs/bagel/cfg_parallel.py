"""Classifier-free guidance with its views on different Workers: the Walk drives the flow's steps.

Each step of the ``image_gen_cfg_parallel`` Walk calls one velocity node per view (``velocity`` over
``llm``, ``velocity_cfg_text`` over ``llm_cfg_text``, ``velocity_cfg_img`` over ``llm_cfg_img``; each
runs where its view's KV lives and evaluates one velocity at the step's state), then ``cfg_step``
(this module's node) combines them as the engine-resident flow does and takes the Euler step. A
branch the step does not need (outside the guidance interval, or a request without it) is not
called: the Walk's gates below decide from the request's ``gen_params`` and the step count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from mstar.engine.flow_state import planned_deltas
from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.guidance import timesteps
from mstar_graphs.bagel.guided_branches import branches_needed, guided_velocity

STEP_NODE = "cfg_step"


def schedule(params: GenerationParams) -> torch.Tensor:
    """The flow's times t_0 .. t_S in fp32, exactly as the module's plan gives them to the engine."""
    return timesteps(params.guidance.steps, params.guidance.timestep_shift).float()


def evaluations(state) -> int:
    """The Walk's trip count: S velocity evaluations (steps - 1)."""
    return GenerationParams.unpack(state.request.inputs["gen_params"]).guidance.steps - 1


def _needed(state, which: int) -> int:
    params = GenerationParams.unpack(state.request.inputs["gen_params"])
    step = state.call_counts.get(STEP_NODE, 0)  # cfg_step calls so far: the step about to be evaluated
    return int(branches_needed(params, schedule(params).tolist()[step])[which])


def no_text_needed(state) -> int:
    """1 when this step evaluates the no-text branch (a DynamicLoop trip count), else 0."""
    return _needed(state, 0)


def no_image_needed(state) -> int:
    """1 when this step evaluates the no-image view branch, else 0."""
    return _needed(state, 1)


class CfgStepNode(NodeSubmodule):
    """``x`` [N, C] at t_step, ``step`` (absent: 0), ``gen_params``, ``v_cond`` and, when the step
    evaluated them, ``v_no_text`` / ``v_no_image`` -> the next ``x`` and ``step``; after the last step
    only ``latent`` (the final latent tokens), so the Walk's outputs are the final state alone."""

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        return {"calls": list(calls)}

    def forward(self, calls: list[NodeCall]) -> dict[str, list[dict[str, torch.Tensor]]]:  # type: ignore[override]
        return {"per_call": [step_once(call.inputs) for call in calls]}

    def split_outputs(self, outputs, calls):
        return outputs["per_call"]


def step_once(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One guided Euler step ``x += (t_{i+1} - t_i) * v`` (the engine's op order, so the same bits)."""
    params = GenerationParams.unpack(inputs["gen_params"])
    times = schedule(params)
    step = int(inputs["step"]) if "step" in inputs else 0
    if not 0 <= step < times.numel() - 1:
        raise ValueError(f"cfg_step: input 'step' is {step}; the schedule has steps 0..{times.numel() - 2}")
    t = times.tolist()[step]
    v_cond = inputs["v_cond"].float()
    v = guided_velocity(params, v_cond, _optional(inputs, "v_no_text"), _optional(inputs, "v_no_image"), t)
    x = inputs["x"].float().reshape(v_cond.shape) + planned_deltas(times)[step] * v.float()
    if step + 1 == times.numel() - 1:
        return {"latent": x}
    return {"x": x, "step": torch.tensor(step + 1)}


def _optional(inputs: Mapping[str, torch.Tensor], name: str) -> torch.Tensor | None:
    value = inputs.get(name)
    return None if value is None else value.float()
