"""A toy prefix LM + flow expert (the shape of pi0.5, tiny): prefix KV computed once, flow steps over it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.graph import Call, GraphEdge, GraphNode, Loop, LoopMode, ModelGraph
from support.toy_models import ToyLM


class ToyFlowLM(ToyLM):
    """ToyLM whose rows may enter as embeddings, plus an action expert with its own weights
    that attends, layer by layer, to the prefix KV and its own H suffix rows."""

    action_horizon = 6
    action_dim = 3

    def __init__(self, seed: int = 0, **kw) -> None:
        super().__init__(seed=seed, **kw)
        g = torch.Generator().manual_seed(seed + 1)
        hidden, d = self.embed.shape[1], self.head_dim
        qkv = (self.heads + 2 * self.kv_heads) * d
        self.e_qkv = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(hidden, qkv, generator=g) / hidden**0.5) for _ in self.qkv]
        )
        self.e_out = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(self.heads * d, hidden, generator=g) / hidden**0.5) for _ in self.qkv]
        )
        self.a_in = torch.nn.Parameter(torch.randn(self.action_dim, hidden, generator=g))
        self.t_in = torch.nn.Parameter(torch.randn(hidden, generator=g))
        self.a_out = torch.nn.Parameter(torch.randn(hidden, self.action_dim, generator=g) / hidden**0.5)
        self.prefix_rows = 0  # rows the prefix LM computed (to show the prefix is not recomputed per step)

    def forward(self, input_ids, positions, attn, embeds=None, embed_mask=None):
        x = self.embed[input_ids]
        if embeds is not None:
            x = torch.where(embed_mask[:, None], embeds.to(x.dtype), x)
        self.prefix_rows += int(input_ids.numel())
        return self._layers(x + self.pos[positions], attn, self.qkv, self.out)

    def _layers(self, x, attn, qkv, out):
        d = self.head_dim
        for layer, (w, o) in enumerate(zip(qkv, out)):
            q, k, v = (x @ w).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
            h = attn(
                layer, q.view(-1, self.heads, d), k.view(-1, self.kv_heads, d), v.view(-1, self.kv_heads, d), d**-0.5
            )
            x = x + torch.tanh(h.reshape(-1, self.heads * d) @ o)
        return x

    def _suffix_in(self, x, t):
        return x @ self.a_in + t[:, None, None] * self.t_in

    def flow_velocity(self, x, t, positions, attn):
        b, h, _ = x.shape
        s = self._suffix_in(x, t).reshape(b * h, -1) + self.pos[positions]
        return (self._layers(s, attn, self.e_qkv, self.e_out) @ self.a_out).reshape(b, h, -1)

    # -- dense reference: prefix and suffix recomputed jointly at every Euler step -------------
    def reference_actions(self, ids, embeds, embed_mask, noise, steps, guide=None, weights=None):
        n = len(ids)
        prefix = self.embed[torch.tensor(ids)]
        if embeds is not None:
            prefix = prefix.clone()
            prefix[embed_mask] = embeds
        x, dt = noise.clone(), -1.0 / steps
        for i in range(steps):
            t = 1.0 - i / steps
            rows = (
                torch.cat([prefix, self._suffix_in(x[None], torch.tensor([t]))[0]]) + self.pos[torch.arange(n + len(x))]
            )
            rows = self._dense_layers(rows, n)
            x = x + dt * (rows[n:] @ self.a_out)
            if guide is not None:
                tn = 1.0 - (i + 1) / steps
                w = weights.reshape(-1, 1)
                x = w * (tn * noise + (1 - tn) * guide) + (1 - w) * x
        return x

    def _dense_layers(self, rows, n):
        total, d = rows.shape[0], self.head_dim
        allowed = torch.zeros(total, total, dtype=torch.bool)
        allowed[:, :n] = True  # everyone sees the whole prefix (bidirectional prefix)
        allowed[n:, n:] = True  # suffix rows see each other
        for layer in range(len(self.qkv)):
            q_all, k_all, v_all = [], [], []
            for part, w in ((slice(0, n), self.qkv[layer]), (slice(n, total), self.e_qkv[layer])):
                q, k, v = (rows[part] @ w).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
                q_all.append(q), k_all.append(k), v_all.append(v)
            q = torch.cat(q_all).view(total, self.heads, d).transpose(0, 1)
            rep = self.heads // self.kv_heads
            k = torch.cat(k_all).view(total, self.kv_heads, d).transpose(0, 1).repeat_interleave(rep, 0)
            v = torch.cat(v_all).view(total, self.kv_heads, d).transpose(0, 1).repeat_interleave(rep, 0)
            h = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(0, 1).reshape(total, -1)
            rows = torch.cat(
                [rows[:n] + torch.tanh(h[:n] @ self.out[layer]), rows[n:] + torch.tanh(h[n:] @ self.e_out[layer])]
            )
        return rows


def flow_graph(steps: int = 4) -> ModelGraph:
    """prefill: the prefix (ids + embeddings) once; act: a flow Loop of ``steps`` Euler steps over its KV."""

    def next_walk(state):
        return {None: "prefill", "prefill": "act"}.get(state.last_walk)

    return ModelGraph(
        name="toy_flow",
        nodes=[
            GraphNode("prefix", inputs=["input_ids", "embeds", "embed_mask"], outputs=[], engine="ar", module="lm"),
            GraphNode(
                "act",
                inputs=["x", "guide", "guide_weights"],
                outputs=["x"],
                engine="ar",
                module="lm",
                kv_from="prefix",
                loop_mode=LoopMode.FLOW,
            ),
        ],
        edges=[
            GraphEdge("input.ids", "prefix.input_ids"),
            GraphEdge("input.embeds", "prefix.embeds"),
            GraphEdge("input.embed_mask", "prefix.embed_mask"),
            GraphEdge("input.noise", "act.x"),
            GraphEdge("input.guide", "act.guide"),
            GraphEdge("input.guide_weights", "act.guide_weights"),
            GraphEdge("act.x", "act.x"),
            GraphEdge("act.x", "output.actions"),
        ],
        walks={"prefill": Call("prefix"), "act": Loop(Call("act"), max_iters=steps)},
        next_walk=next_walk,
    )
