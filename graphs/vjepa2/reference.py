"""Meta's native V-JEPA 2-AC rollout and CEM planner (``notebooks/utils``), for parity and benchmarks.

Native: every rollout step re-runs the predictor over the whole growing context (no cache) and
appends the last frame's (layer-normed) prediction and the advanced pose. Same weights as ours
(``VJepa2Predictor.native_forward``), same sampling and refit, so the outputs agree.
"""

from __future__ import annotations

import torch

from mstar_graphs.vjepa2.planner import CemParams, initial_belief, plan_from_belief, refit_belief, sample_actions


@torch.no_grad()
def native_rollout(
    predictor, latents: torch.Tensor, actions: torch.Tensor, states: torch.Tensor, rollout_actions: torch.Tensor
) -> torch.Tensor:
    """latents [C + 1, P, D] (ending with the start frame), actions [C, 7] (taken at the context
    frames), states [C + 1, 7], rollout_actions [S, H, 7] -> predicted frames [S, H, P, D]."""
    S, H = rollout_actions.shape[:2]
    z = latents[None].expand(S, *latents.shape).clone()
    a = actions[None].expand(S, *actions.shape)
    s = states[None].expand(S, *states.shape)
    state = s[:, -1]
    out = []
    for h in range(H):
        a = torch.cat([a, rollout_actions[:, h : h + 1]], dim=1)
        pred = predictor.native_forward(z, a, s)[:, -1]
        out.append(pred)
        state = predictor.advance_state(state, rollout_actions[:, h]).float()
        z = torch.cat([z, pred[:, None]], dim=1)
        s = torch.cat([s, state[:, None]], dim=1)
    return torch.stack(out, dim=1)


@torch.no_grad()
def native_plan(
    predictor,
    latents: torch.Tensor,
    actions: torch.Tensor,
    states: torch.Tensor,
    goal: torch.Tensor,
    params: CemParams,
    horizon: int,
    seed: int,
    iterations: int,
    chunk: int = 8,
) -> dict[str, torch.Tensor]:
    """Meta's CEM with the native rollout. Iteration i samples from the generator seeded as our
    ``sample`` node's i-th call of a request with ``seed``. Samples go through in chunks of
    ``chunk`` (the same arithmetic; bounds the dense attention's memory)."""
    mean, std = initial_belief(horizon, params)
    energies = torch.empty(0)
    for it in range(iterations):
        generator = torch.Generator().manual_seed((seed * 1_000_003 + it) % (2**63))
        samples = sample_actions(mean, std, params, generator)
        last = torch.cat(
            [
                native_rollout(predictor, latents, actions, states, samples[i : i + chunk])[:, -1]
                for i in range(0, samples.shape[0], chunk)
            ]
        )
        energies = (last - goal).abs().flatten(1).mean(dim=1)
        mean, std = refit_belief(samples, energies, mean, std, params)
    return {"plan": plan_from_belief(mean), "energies": energies}
