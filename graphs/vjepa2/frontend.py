"""V-JEPA 2-AC's requests, one builder per walk (``graph.WALKS``): what a robot front end submits.

A session (``session_id``) holds the context of observed frames in the predictor's KV; ``encode`` is
sessionless. Inputs are tensors as the graph's nodes take them (frames [T, H, W, 3] uint8, states and
actions [T, 7]). Every request is of class ``control`` (a robot waits for it) unless ``priority``
says otherwise (an offline rollout benchmark: ``batch``).
"""

from __future__ import annotations

import torch

from mstar.priority import Priority
from mstar.request import Request
from mstar.sampling_params import SamplingParams
from mstar_graphs.vjepa2.planner import CemParams, initial_belief


def encode_request(frames: torch.Tensor, *, priority: Priority | str = Priority.CONTROL) -> Request:
    """Frames -> their ``latents`` (a goal image's, for :func:`plan_request`), outside any session."""
    return Request({"frames": frames}, meta={"walk": "encode"}, priority=Priority.parse(priority))


def observe_request(
    frames: torch.Tensor,
    states: torch.Tensor,
    actions: torch.Tensor,
    *,
    session_id: str,
    kv_window: int | None = None,
    priority: Priority | str = Priority.CONTROL,
) -> Request:
    """Frames with the robot's states and the actions between them, appended to the session's context;
    ``kv_window`` keeps only the last that many frames (default: the model's whole context)."""
    meta: dict[str, object] = {"walk": "observe"}
    if kv_window is not None:
        meta["context.kv_window"] = kv_window
    return Request(
        {"frames": frames, "states": states, "actions": actions},
        session_id=session_id,
        meta=meta,
        priority=Priority.parse(priority),
    )


def rollout_request(
    actions: torch.Tensor, *, session_id: str, all_frames: bool = False, priority: Priority | str = Priority.CONTROL
) -> Request:
    """Predict the frames ``actions`` ([H, 7] or [S, H, 7]) lead to from the session's context: the last
    prediction, or with ``all_frames`` every step's."""
    meta: dict[str, object] = {"walk": "rollout"}
    if all_frames:
        meta["rollout.all_frames"] = 1
    return Request({"actions": actions}, session_id=session_id, meta=meta, priority=Priority.parse(priority))


def plan_request(
    goal: torch.Tensor,
    horizon: int,
    params: CemParams,
    *,
    session_id: str,
    seed: int | None = None,
    priority: Priority | str = Priority.CONTROL,
) -> Request:
    """A ``plan`` request: CEM from Meta's initial belief over the session's frames toward ``goal``
    [P, D] (an encoded goal image). Outputs ``plan`` [H, 7] and ``energies`` [S] per iteration.
    ``seed`` (>= 0) makes the plan reproducible; None: the runtime draws one."""
    if seed is not None and not 0 <= seed < 2**63:
        raise ValueError(f"a plan's seed must be in [0, 2**63) or None (drawn per request), got {seed}")
    mean, std = initial_belief(horizon, params)
    return Request(
        {"goal": goal, "mean": mean, "std": std, "params": params.tensor()},
        session_id=session_id,
        sampling=SamplingParams(seed=seed),
        meta={"walk": "plan", "iterations": params.iterations},
        outputs=frozenset({"plan", "energies"}),
        priority=Priority.parse(priority),
    )
