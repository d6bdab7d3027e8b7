"""Qwen3-Omni's mixture-of-experts feed-forward: top-k softmax routing, experts batched per expert.

Routing as transformers computes it: ``softmax(router(x))`` in fp32, top-k, renormalised over the
k when ``norm_topk_prob``, cast back. The Talker adds a shared expert scaled by
``sigmoid(shared_expert_gate(x))``.

Experts are loaded per expert, the checkpoint's layout (``experts.{e}.gate_proj.weight`` ...), then
:meth:`SparseMoE.fuse` stacks them into ``[E, 2I, H]`` / ``[E, H, I]``. A step's rows (all
sequences of the batch, prefill and decode together) are grouped by expert: each expert that got
rows runs one matmul over all of them, never row by row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar_graphs.common.mlp import GatedMLP


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        inner: int,
        num_experts: int,
        top_k: int,
        norm_topk_prob: bool,
        shared_inner: int = 0,
        **factory,
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False, **factory)  # the router
        self.experts = nn.ModuleList(GatedMLP(hidden, inner, **factory) for _ in range(num_experts))
        self.inner = inner
        if shared_inner:
            self.shared_expert = GatedMLP(hidden, shared_inner, **factory)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False, **factory)
        self.gate_up: torch.Tensor | None = None  # [E, 2I, H] after fuse()
        self.down: torch.Tensor | None = None  # [E, H, I]
        self.tp = None  # a TPGroup once sharded (tensor_parallel.shard_moe): each rank holds a slice of I

    def fuse(self) -> None:
        """Stack the loaded experts (after loading: the per-expert names are gone)."""
        with torch.no_grad():
            gate_up = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in self.experts])
            down = torch.stack([e.down_proj.weight for e in self.experts])
        del self.experts
        self.gate_up = nn.Parameter(gate_up, requires_grad=False)  # parameters: .to(dtype) converts them
        self.down = nn.Parameter(down, requires_grad=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] -> [T, H]."""
        weights, ids = self.route(x)
        out = torch.zeros_like(x)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (row, slot) pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = order // self.top_k
        slot_weights = weights.reshape(-1)[order]
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            picked = rows[start : start + n]
            y = self._expert(expert, x.index_select(0, picked))
            out.index_add_(0, picked, y * slot_weights[start : start + n, None])
            start += n
        if self.tp is not None:  # every rank summed its slice of each expert's inner width
            self.tp.all_reduce_(out)
        if hasattr(self, "shared_expert"):
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:
            return self.experts[e](x)
        gate, up = F.linear(x, self.gate_up[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down[e])
