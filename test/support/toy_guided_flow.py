"""A toy planned flow module with guidance branches (the shape of classifier-free guidance, tiny).

Views of the module prefill contexts (causal, optionally with rope_positions); a flow call plans
``n`` + 1 suffix rows (a marker row, then one per state row), a state [n, 3], its timesteps and
branch count from its inputs (and, optionally, its progress reports: ``report_every``,
``predict_steps``). Each branch's velocity depends on that branch's context KV; the
combine mixes them with the input ``scale``. A dense reference recomputes one branch at a time.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from mstar.engine.flow_plan import FlowEval, FlowPlan
from support.toy_flow import ToyFlowLM

DEFAULT_TIMES = torch.tensor([1.0, 0.7, 0.35, 0.0])


class ToyGuidedFlow(ToyFlowLM):
    accepts_rope_positions = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed=seed)
        g = torch.Generator().manual_seed(seed + 7)
        self.marker = torch.nn.Parameter(torch.randn(self.embed.shape[1], generator=g))
        self.calls: list[list[tuple[int, int]]] = []  # per flow_velocity call: (branch, step) of each eval
        self.first_positions: list[list[int]] = []  # per call: the first position of each eval's rows

    def forward(self, input_ids, positions, attn, rope_positions=None):
        pos = positions if rope_positions is None else rope_positions[0]
        return self._layers(self.embed[input_ids] + self.pos[pos], attn, self.qkv, self.out)

    # -- the planned flow contract ------------------------------------------------------------
    def flow_plan(self, inputs: Mapping[str, torch.Tensor]) -> FlowPlan:
        n = int(inputs["n"])
        times = inputs.get("timesteps", DEFAULT_TIMES).float()
        predict = inputs.get("predict_steps")
        return FlowPlan(
            rows=n + 1,
            state_shape=(n, self.action_dim),
            timesteps=times,
            branches=int(inputs["branches"]),
            report_every=int(inputs.get("report_every", 0)),
            predict_steps=() if predict is None else tuple(int(k) for k in predict.reshape(-1)),
        )

    def flow_branches(self, inputs, step: int, t: float) -> list[bool]:
        gate = inputs.get("gate")
        return [True] * int(inputs["branches"]) if gate is None else [bool(g) for g in gate[step]]

    def flow_velocity(self, x, t, positions, attn, evals: list[FlowEval]):
        rows, start, firsts = [], 0, []
        for i, e in enumerate(evals):
            n = e.plan.rows
            firsts.append(int(positions[start]))
            rows.append(self._suffix_rows(x[i], t[i], positions[start : start + n]))
            start += n
        self.calls.append([(e.branch, e.step) for e in evals])
        self.first_positions.append(firsts)
        out = self._layers(torch.cat(rows), attn, self.e_qkv, self.e_out) @ self.a_out
        blocks = out.split([e.plan.rows for e in evals])
        return torch.stack([b[1:] for b in blocks])

    def flow_combine(self, velocities, inputs, step: int, t: float):
        return combine(velocities, float(inputs.get("scale", torch.tensor(1.5))))

    def _suffix_rows(self, x, t, positions):
        return torch.cat([self.marker[None], x @ self.a_in]) + t * self.t_in + self.pos[positions]

    # -- dense reference: one branch, its context and suffix recomputed together -----------------
    def reference_velocity(self, ids, positions, x, t: float) -> torch.Tensor:
        """Velocity [n, 3] over a causal context ``ids`` at rope ``positions``; the suffix starts at
        max(positions) + 1 (0 for an empty context)."""
        n, r = len(ids), x.shape[0] + 1
        start = int(max(positions)) + 1 if n else 0
        context = self.embed[torch.tensor(ids, dtype=torch.long)] + self.pos[torch.tensor(positions, dtype=torch.long)]
        suffix = self._suffix_rows(x, torch.tensor(t), start + torch.arange(r))
        rows = torch.cat([context, suffix])
        allowed = torch.ones(n + r, n + r, dtype=torch.bool).tril()
        allowed[n:, :] = True  # the suffix sees its whole context and itself
        d, rep = self.head_dim, self.heads // self.kv_heads
        with torch.no_grad():
            for layer in range(len(self.qkv)):
                parts = [(rows[:n] @ self.qkv[layer]), (rows[n:] @ self.e_qkv[layer])]
                q, k, v = torch.cat(parts).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
                q = q.view(-1, self.heads, d).transpose(0, 1)
                k = k.view(-1, self.kv_heads, d).transpose(0, 1).repeat_interleave(rep, 0)
                v = v.view(-1, self.kv_heads, d).transpose(0, 1).repeat_interleave(rep, 0)
                h = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(0, 1).reshape(n + r, -1)
                rows = torch.cat(
                    [rows[:n] + torch.tanh(h[:n] @ self.out[layer]), rows[n:] + torch.tanh(h[n:] @ self.e_out[layer])]
                )
        return (rows[n:] @ self.a_out)[1:]


def combine(velocities, scale: float) -> torch.Tensor:
    """The main velocity pushed away from each evaluated guidance branch's (unevaluated ones skipped)."""
    main = velocities[0]
    v = main
    for i, other in enumerate(velocities[1:], start=1):
        if other is not None:
            v = v + (scale / i) * (main - other)
    return v
