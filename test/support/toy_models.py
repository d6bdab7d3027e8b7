"""Small synthetic components and graphs for runtime tests (no real model needed)."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from mstar.engine.ar_module import ARModule
from mstar.engine.attention.backend import AttentionContext
from mstar.engine.kv_cache import KVSpec
from mstar.graph import NodeSubmodule


class ToyLM(ARModule):
    """A 2-layer attention-only LM: enough to exercise paged KV, masks and batching."""

    def __init__(
        self,
        vocab: int = 97,
        hidden: int = 32,
        heads: int = 4,
        kv_heads: int = 2,
        layers: int = 2,
        max_positions: int = 512,
        seed: int = 0,
    ) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self._vocab, self._max = vocab, max_positions
        self.embed = torch.nn.Parameter(torch.randn(vocab, hidden, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(max_positions, hidden, generator=g) * 0.5)
        d = self.head_dim
        self.qkv = torch.nn.ParameterList(
            [
                torch.nn.Parameter(torch.randn(hidden, (heads + 2 * kv_heads) * d, generator=g) / hidden**0.5)
                for _ in range(layers)
            ]
        )
        self.out = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(heads * d, hidden, generator=g) / hidden**0.5) for _ in range(layers)]
        )
        self.head = torch.nn.Parameter(torch.randn(hidden, vocab, generator=g) * 2.0)

    def kv_spec(self) -> KVSpec:
        return KVSpec(len(self.qkv), self.kv_heads, self.head_dim)

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def max_positions(self) -> int:
        return self._max

    def forward(self, input_ids, positions, attn: AttentionContext):
        return self.layers(self.embed[input_ids] + self.pos[positions], attn)

    def layers(self, x, attn: AttentionContext):
        d = self.head_dim
        for layer, (w, o) in enumerate(zip(self.qkv, self.out)):
            q, k, v = (x @ w).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
            h = attn(
                layer, q.view(-1, self.heads, d), k.view(-1, self.kv_heads, d), v.view(-1, self.kv_heads, d), d**-0.5
            )
            x = x + torch.tanh(h.reshape(-1, self.heads * d) @ o)
        return x

    def compute_logits(self, hidden, token_ids=None):
        w = self.head if token_ids is None else self.head[:, token_ids]
        return hidden @ w

    # -- an independent dense reference (no paging, no batching) ----------------------
    def reference_logits(self, ids: list[int]) -> torch.Tensor:
        n = len(ids)
        x = self.embed[torch.tensor(ids)] + self.pos[torch.arange(n)]
        d = self.head_dim
        for w, o in zip(self.qkv, self.out):
            q, k, v = (x @ w).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
            q = q.view(n, self.heads, d).transpose(0, 1)
            k = k.view(n, self.kv_heads, d).transpose(0, 1).repeat_interleave(self.heads // self.kv_heads, 0)
            v = v.view(n, self.kv_heads, d).transpose(0, 1).repeat_interleave(self.heads // self.kv_heads, 0)
            h = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + torch.tanh(h.transpose(0, 1).reshape(n, -1) @ o)
        return x @ self.head

    def reference_greedy(self, prompt: list[int], n: int, stop: int | None = None) -> list[int]:
        ids, out = list(prompt), []
        with torch.no_grad():
            for _ in range(n):
                tok = int(self.reference_logits(ids)[-1].argmax())
                if tok == stop:
                    break
                out.append(tok)
                ids.append(tok)
        return out


class Scale(NodeSubmodule):
    """Stateless: multiplies its (stacked) input by a factor."""

    def __init__(self, factor: float = 2.0) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return {"y": x.float() * self.factor}


class SumChunk(NodeSubmodule):
    """Stateless: sums a chunk of streamed items (context included) and counts its new items."""

    def prepare_inputs(self, calls):
        return {
            "x": torch.stack([c.inputs["x"].float().sum() for c in calls]),
            "n": torch.tensor([len(c.inputs["x"]) - c.meta.get("left_context", 0) for c in calls]),
        }

    def batch_key(self, call):
        return "all"

    def forward(self, x, n):
        return {"y": x, "n": n}


# -- added for the Walk Graph tests (test/runtime/graph) ---------------------------------
class CountingScale(Scale):
    """Scale that counts the calls (rows) it computed, so a test can see which nodes ran."""

    def __init__(self, factor: float = 2.0) -> None:
        super().__init__(factor)
        self.calls = 0

    def forward(self, x):
        self.calls += int(x.shape[0])
        return super().forward(x)


class AddOne(NodeSubmodule):
    """Stateless: y = x + 1, keeping the dtype (integer values for StopOnValues)."""

    def forward(self, x):
        return {"y": x + 1}


class Add(NodeSubmodule):
    """Stateless: y = a + b (a join of two branches)."""

    def forward(self, a, b):
        return {"y": a.float() + b.float()}


class ChunkProbe(NodeSubmodule):
    """Stateless: describes each streamed chunk it gets.

    Outputs per call: ``total`` (sum of every item, left context included), ``new``
    (sum of the new items only), ``n`` (number of new items), ``ctx`` (left context)
    and ``first`` (the chunk's first item, context included).
    """

    def prepare_inputs(self, calls):
        rows = []
        for c in calls:
            x = c.inputs["x"].reshape(-1).double()
            ctx = int(c.meta.get("left_context", 0))
            rows.append([x.sum(), x[ctx:].sum(), len(x) - ctx, ctx, x[0]])
        return {"stats": torch.tensor(rows, dtype=torch.float64)}

    def batch_key(self, call):
        return "all"

    def forward(self, stats):
        return {
            "total": stats[:, 0],
            "new": stats[:, 1],
            "n": stats[:, 2].long(),
            "ctx": stats[:, 3].long(),
            "first": stats[:, 4],
        }


class RangeConstrainedLM(ToyLM):
    """ToyLM with constrained decoding: generated token ``i`` must lie in ``ranges[i % len(ranges)]``
    (each entry a list of [lo, hi) spans, or None for the whole vocabulary)."""

    def __init__(self, ranges=(((0, 10),), ((50, 60),)), **kw) -> None:
        super().__init__(**kw)
        self.ranges = [None if r is None else [tuple(span) for span in r] for r in ranges]

    def allowed_token_ranges(self, num_generated: int):
        return self.ranges[num_generated % len(self.ranges)]


class RowsLM(ToyLM):
    """ToyLM that leaves each row's input embedding in ``rows_out`` (row output ``rows``, streamed by a
    Loop as ``step_rows``); ``delay_s`` slows every step (a producer slower than its consumer)."""

    row_outputs = ("rows",)

    def __init__(self, delay_s: float = 0.0, **kw) -> None:
        super().__init__(**kw)
        self.delay_s = delay_s

    def forward(self, input_ids, positions, attn: AttentionContext):
        if self.delay_s:
            time.sleep(self.delay_s)
        self.rows_out = {"rows": self.embed[input_ids]}
        return super().forward(input_ids, positions, attn)


class FedLM(ToyLM):
    """ToyLM whose Loop feeds back the sampled token's embedding plus row ``iteration + 1`` of its side
    input ``text`` (rows that may still be arriving: a fed input), an end row once the text has ended,
    then nothing: the Talker's use of the Thinker's reply, in small."""

    has_feedback = True

    def __init__(self, **kw) -> None:
        super().__init__(seed=1, **kw)
        self.end_row = torch.nn.Parameter(torch.randn(self.embed.shape[1], generator=torch.Generator().manual_seed(5)))

    def forward(self, input_ids, positions, attn: AttentionContext, embeds=None, embed_mask=None):
        x = self.embed[input_ids]
        if embeds is not None and embed_mask is not None and bool(embed_mask.any()):
            x = x.clone()
            x[embed_mask] = embeds[embed_mask].to(x.dtype)
        return self.layers(x + self.pos[positions], attn)

    def feedback_ready(self, call) -> bool:
        if "text" not in call.open_inputs:
            return True
        text = call.inputs.get("text")
        return text is not None and call.iteration + 1 < text.shape[0]

    def feedback(self, hidden, tokens, calls):
        rows = []
        for token, c in zip(tokens, calls):
            text, k = c.inputs.get("text"), c.iteration + 1
            have = 0 if text is None else text.shape[0]
            if k < have:
                extra = text[k]
            else:
                assert "text" not in c.open_inputs, "feedback ran before its text row came"
                extra = self.end_row if k == have else torch.zeros_like(self.end_row)
            rows.append(self.embed[token] + extra.to(self.embed.dtype))
        return torch.stack(rows), [{} for _ in calls]
