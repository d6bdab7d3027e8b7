"""A toy LM for bidirectional spans and row kinds: it emits every row's hidden state (a row output),
adds a learned row per kind, and has a dense reference with the span mask written out."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.engine.attention.backend import AttentionContext
from support.toy_models import ToyLM


def span_mask(n: int, spans=()) -> torch.Tensor:
    """[n, n] bool: causal, plus every row of a span sees the whole span."""
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    for a, b in spans:
        allowed[a:b, a:b] = True
    return allowed


class RowKindsLM(ToyLM):
    """ToyLM with ``row_kinds``: kind k adds ``kind_rows[k]`` to its rows' inputs, so the hidden
    states show which kind a row had."""

    row_outputs = ("hidden",)
    accepts_row_kinds = True

    def __init__(self, kinds: int = 3, **kw) -> None:
        super().__init__(**kw)
        g = torch.Generator().manual_seed(11)
        hidden = self.embed.shape[1]
        self.kind_rows = torch.nn.Parameter(torch.randn(kinds, hidden, generator=g))
        self.kinds_seen: list[torch.Tensor] = []

    def forward(self, input_ids, positions, attn: AttentionContext, row_kinds=None):
        assert row_kinds is not None and row_kinds.shape == input_ids.shape  # the engine always packs them
        self.kinds_seen.append(row_kinds.clone())
        x = self.embed[input_ids] + self.pos[positions] + self.kind_rows[row_kinds]
        x = self.layers(x, attn)
        self.rows_out = {"hidden": x}
        return x

    def reference_hidden(self, ids, spans=(), kinds=None) -> torch.Tensor:
        """Every row's hidden state, dense, with the span mask written out."""
        n = len(ids)
        kinds = torch.zeros(n, dtype=torch.long) if kinds is None else torch.as_tensor(kinds)
        x = self.embed[torch.tensor(ids)] + self.pos[torch.arange(n)] + self.kind_rows[kinds]
        allowed, d, rep = span_mask(n, spans), self.head_dim, self.heads // self.kv_heads
        with torch.no_grad():
            for w, o in zip(self.qkv, self.out):
                q, k, v = (x @ w).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
                q = q.view(n, self.heads, d).transpose(0, 1)
                k = k.view(n, self.kv_heads, d).transpose(0, 1).repeat_interleave(rep, 0)
                v = v.view(n, self.kv_heads, d).transpose(0, 1).repeat_interleave(rep, 0)
                h = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
                x = x + torch.tanh(h.transpose(0, 1).reshape(n, -1) @ o)
        return x
