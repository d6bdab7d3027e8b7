"""CEM planning over action sequences, as Meta's V-JEPA 2-AC MPC does it (``notebooks/utils/mpc_utils.py``).

The belief over a horizon of H actions is a mean and a std over 4 dims per step (x, y, z and
the gripper; rotation deltas stay 0). One CEM iteration: ``sample`` draws S action sequences
(xyz clipped to +-maxnorm, gripper to +-0.75), the rollout node predicts each sequence's last
frame, ``energy`` scores it (mean L1 to the goal latent, both layer-normed), ``refit`` keeps the
top-k lowest energies and moves the belief toward their mean and (unbiased) std with momentum.
The plan is the mean with the rotation zero and a gripper mean under 0.25 in size set to 0.

Every node is a stateless node batching calls of several robots; a sample call's noise comes
from its own generator (the request's seed and the call's index), so a plan is the same
whether or not other robots' calls share its batch. ``frontend.plan_request`` builds a plan request: with
a ``seed`` the same seed, session frames, goal and parameters give the same plan; without one the
runtime draws a seed per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import torch

from mstar.graph.node import NodeCall, NodeSubmodule

BELIEF_DIMS = 4  # x, y, z, gripper
GRIPPER_CLIP = 0.75
GRIPPER_ROUND = 0.25


class CemParams(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Meta's world-model wrapper defaults (gripper momenta: the ``cem`` function's)."""

    samples: int = 400
    topk: int = 10
    iterations: int = 10
    maxnorm: float = 0.05
    momentum_mean: float = 0.15
    momentum_std: float = 0.15
    momentum_mean_gripper: float = 0.15
    momentum_std_gripper: float = 0.15

    def __post_init__(self) -> None:
        checks = [
            ("samples", self.samples >= 2),
            ("topk", 2 <= self.topk <= self.samples),
            ("iterations", self.iterations >= 1),
            ("maxnorm", self.maxnorm > 0),
        ]
        checks += [
            (name, 0.0 <= getattr(self, name) <= 1.0)
            for name in ("momentum_mean", "momentum_std", "momentum_mean_gripper", "momentum_std_gripper")
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(
                    f"CEM parameters: {name} = {getattr(self, name)!r} is invalid "
                    f"(samples >= 2, 2 <= topk <= samples, iterations >= 1, maxnorm > 0, momenta in [0, 1])"
                )

    def tensor(self) -> torch.Tensor:
        return torch.tensor(
            [
                self.samples,
                self.topk,
                self.maxnorm,
                self.momentum_mean,
                self.momentum_std,
                self.momentum_mean_gripper,
                self.momentum_std_gripper,
            ],
            dtype=torch.float64,
        )

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> CemParams:
        v = t.double().reshape(-1).tolist()
        if len(v) != 7:
            raise ValueError(f"CEM 'params' must hold 7 values (samples, topk, maxnorm, 4 momenta); got {len(v)}")
        return cls(
            samples=int(v[0]),
            topk=int(v[1]),
            maxnorm=v[2],
            momentum_mean=v[3],
            momentum_std=v[4],
            momentum_mean_gripper=v[5],
            momentum_std_gripper=v[6],
        )


def initial_belief(horizon: int, params: CemParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Meta's start: mean 0; std maxnorm for xyz, 1 for the gripper. [H, 4] each."""
    if horizon < 1:
        raise ValueError(f"a plan needs a horizon >= 1, got {horizon}")
    mean = torch.zeros(horizon, BELIEF_DIMS)
    std = torch.cat([torch.full((horizon, 3), params.maxnorm), torch.ones(horizon, 1)], dim=1)
    return mean, std


def to_action(xyzg: torch.Tensor) -> torch.Tensor:
    """[..., 4] (x, y, z, gripper) -> [..., 7] actions with zero rotation deltas."""
    zeros = torch.zeros(*xyzg.shape[:-1], 3, dtype=xyzg.dtype)
    return torch.cat([xyzg[..., :3], zeros, xyzg[..., 3:]], dim=-1)


def sample_actions(
    mean: torch.Tensor, std: torch.Tensor, params: CemParams, generator: torch.Generator
) -> torch.Tensor:
    """S sequences [S, H, 7] from the belief, step by step in Meta's order."""
    steps = []
    for h in range(mean.shape[0]):
        a = torch.randn(params.samples, BELIEF_DIMS, generator=generator, dtype=torch.float32) * std[h] + mean[h]
        a[:, :3] = a[:, :3].clamp(-params.maxnorm, params.maxnorm)
        a[:, 3:] = a[:, 3:].clamp(-GRIPPER_CLIP, GRIPPER_CLIP)
        steps.append(to_action(a))
    return torch.stack(steps, dim=1)


def refit_belief(
    actions: torch.Tensor, energies: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, params: CemParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """The belief moved toward the top-k (lowest energy) sequences."""
    chosen = actions[energies.topk(params.topk, largest=False).indices]  # [k, H, 7]
    xyzg = torch.cat([chosen[..., :3], chosen[..., 6:]], dim=-1)  # [k, H, 4]
    sel_mean, sel_std = xyzg.mean(dim=0), xyzg.std(dim=0)
    m = torch.tensor([params.momentum_mean] * 3 + [params.momentum_mean_gripper])
    s = torch.tensor([params.momentum_std] * 3 + [params.momentum_std_gripper])
    return sel_mean * (1 - m) + mean * m, sel_std * (1 - s) + std * s


def plan_from_belief(mean: torch.Tensor) -> torch.Tensor:
    """[H, 4] mean -> [H, 7] plan: rotation 0, a gripper mean under 0.25 in size set to 0."""
    grip = mean[:, 3:].clone()
    grip[grip.abs() < GRIPPER_ROUND] = 0.0
    return to_action(torch.cat([mean[:, :3], grip], dim=1))


def _params(call: NodeCall) -> CemParams:
    if "params" not in call.inputs:
        raise ValueError("CEM nodes need input 'params'")
    return CemParams.from_tensor(call.inputs["params"])


class _PerCall(NodeSubmodule):
    """CEM steps are small: computed call by call inside one batch (results do not depend on the batch)."""

    def batch_key(self, call: NodeCall) -> Any:
        return type(self).__name__

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict[str, Any]:  # type: ignore[override]
        return {"calls": list(calls)}

    def split_outputs(self, outputs, calls):  # type: ignore[override]
        return outputs["per_call"]


class CemSample(_PerCall):
    """Node ``sample``: mean, std [H, 4], params -> actions [S, H, 7]."""

    def forward(self, calls: list[NodeCall]) -> dict[str, Any]:  # type: ignore[override]
        out = []
        for call in calls:
            params = _params(call)
            mean, std = call.inputs["mean"].float().cpu(), call.inputs["std"].float().cpu()
            if mean.dim() != 2 or mean.shape[1] != BELIEF_DIMS or std.shape != mean.shape:
                raise ValueError(
                    f"CEM 'mean' and 'std' must both be [H, {BELIEF_DIMS}]; got {tuple(mean.shape)}, {tuple(std.shape)}"
                )
            generator = torch.Generator().manual_seed((call.seed * 1_000_003 + call.index) % (2**63))
            out.append({"actions": sample_actions(mean, std, params, generator)})
        return {"per_call": out}


class CemEnergy(_PerCall):
    """Node ``energy``: frame [S, P, D] (the predicted last frames), goal [P, D] -> energies [S]."""

    def forward(self, calls: list[NodeCall]) -> dict[str, Any]:  # type: ignore[override]
        out = []
        for call in calls:
            frame, goal = call.inputs["frame"].float(), call.inputs["goal"].float()
            if frame.dim() != 3 or tuple(frame.shape[1:]) != tuple(goal.shape):
                raise ValueError(
                    f"energy: 'frame' [S, P, D] and 'goal' [P, D] disagree: {tuple(frame.shape)} vs {tuple(goal.shape)}"
                )
            out.append({"energies": (frame - goal).abs().flatten(1).mean(dim=1)})
        return {"per_call": out}


class CemRefit(_PerCall):
    """Node ``refit``: actions, energies, mean, std, params -> mean, std, plan [H, 7]."""

    def forward(self, calls: list[NodeCall]) -> dict[str, Any]:  # type: ignore[override]
        out = []
        for call in calls:
            params = _params(call)
            mean, std = refit_belief(
                call.inputs["actions"].float(),
                call.inputs["energies"].float(),
                call.inputs["mean"].float(),
                call.inputs["std"].float(),
                params,
            )
            out.append({"mean": mean, "std": std, "plan": plan_from_belief(mean)})
        return {"per_call": out}
