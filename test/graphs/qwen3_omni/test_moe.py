"""The MoE block: experts batched per expert over all rows equal the per-row, per-expert computation."""

from __future__ import annotations

import torch

from mstar_graphs.qwen3_omni.moe import SparseMoE


def per_row(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    weights, ids = moe.route(x)
    rows = []
    for r in range(x.shape[0]):
        y = sum(w * moe.experts[int(e)](x[r : r + 1]) for w, e in zip(weights[r], ids[r]))
        if hasattr(moe, "shared_expert"):
            y = y + torch.sigmoid(moe.shared_expert_gate(x[r : r + 1])) * moe.shared_expert(x[r : r + 1])
        rows.append(y)
    return torch.cat(rows)


def test_batched_experts_equal_row_by_row_fused_or_not():
    torch.manual_seed(0)
    for shared in (0, 24):
        moe = SparseMoE(16, 8, num_experts=6, top_k=2, norm_topk_prob=True, shared_inner=shared)
        x = torch.randn(37, 16)
        with torch.no_grad():
            expected = per_row(moe, x)
            batched = moe(x)
            moe.fuse()
            fused = moe(x)
        assert (batched - expected).abs().max() < 1e-5 and (fused - expected).abs().max() < 1e-5
        assert not hasattr(moe, "experts") and moe.gate_up.shape == (6, 16, 16)


def test_routing_weights_renormalise_over_the_top_k_only_when_asked():
    torch.manual_seed(1)
    x = torch.randn(5, 16)
    for norm in (True, False):
        moe = SparseMoE(16, 8, num_experts=4, top_k=2, norm_topk_prob=norm)
        weights, _ = moe.route(x)
        sums = weights.sum(-1)
        assert torch.allclose(sums, torch.ones(5)) if norm else bool((sums < 1).all())
