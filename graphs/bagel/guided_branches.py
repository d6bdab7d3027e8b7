"""Which guidance branches one image's flow evaluates, and its guided velocity from theirs.

A request's flow has the main branch (its full context, the ``llm`` view) and, per its
GenerationParams, the no-text branch (``llm_cfg_text``) and the no-image branch (``llm_cfg_img``,
only with ``image_branch == "view"``; with ``"main"`` the no-image velocity IS the main one). The
engine-resident flow (BagelFlowLLM.flow_plan / flow_branches / flow_combine) and the CFG-parallel
Walk (mstar_graphs.bagel.cfg_parallel) both read these, so the two paths guide alike.
"""

from __future__ import annotations

import torch

from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.guidance import branches_active, combine


def planned_branches(params: GenerationParams) -> tuple[bool, bool]:
    """(the no-text branch runs at some step, the no-image view branch runs at some step)."""
    g = params.guidance
    text = g.text_scale > 1.0  # at or below 1 the reference applies no guidance at all
    return text, text and g.image_scale > 1.0 and params.image_branch == "view"


def branches_needed(params: GenerationParams, t: float) -> tuple[bool, bool]:
    """(no-text branch, no-image view branch) that the evaluation at time ``t`` needs."""
    text_planned, image_planned = planned_branches(params)
    text, image = branches_active(params.guidance, t)
    return text_planned and text, image_planned and image


def guided_velocity(
    params: GenerationParams,
    v_cond: torch.Tensor,
    v_no_text: torch.Tensor | None,
    v_no_image_view: torch.Tensor | None,
    t: float,
) -> torch.Tensor:
    """The velocity of the Euler step at ``t`` from the branches' (None: a branch not evaluated)."""
    text_planned, image_planned = planned_branches(params)
    if params.image_branch == "main":
        v_no_image = v_cond  # a text-to-image request's no-image context is its full context
    else:
        v_no_image = v_no_image_view if image_planned else None
    return combine(v_cond, v_no_text if text_planned else None, v_no_image, t, params.guidance)
