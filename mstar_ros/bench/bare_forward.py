"""The bare forward of an AR module: one token against a static, preallocated KV, then its LM head.

What ``mstar_ros.bench.step_overhead`` holds an engine decode step against: the model's own work,
without scheduling, paged KV, attention planning or sampling.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

AUDIO_TOKEN = 128266  # the first SNAC code: a bare forward's input (any id does the same work)


class StaticKVAttention:
    """The attention a bare forward calls: one sequence's K/V in contiguous preallocated buffers.

    ``length`` is the number of cached tokens after the step's token is written (set before each
    forward). Scores run in ``compute_dtype``, as the engine's backend computes them (on a CPU: bf16
    with AMX, else fp32).
    """

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        compute_dtype: torch.dtype | None,
        device: torch.device,
    ) -> None:
        shape = (layers, kv_heads, max_len, head_dim)
        gen = torch.Generator().manual_seed(0)  # finite, nonzero keys: the same work as real ones
        self.k = (0.1 * torch.randn(shape, generator=gen)).to(dtype=dtype, device=device)
        self.v = (0.1 * torch.randn(shape, generator=gen)).to(dtype=dtype, device=device)
        self.compute_dtype = compute_dtype
        self.length = 1

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        n = self.length
        self.k[layer, :, n - 1] = k[0]
        self.v[layer, :, n - 1] = v[0]
        hkv, hq, d = self.k.shape[1], q.shape[1], q.shape[2]
        cdt = self.compute_dtype or q.dtype
        keys = self.k[layer, :, :n].to(cdt)[None]  # [1, Hkv, n, D]
        values = self.v[layer, :, :n].to(cdt)[None]
        # one query: its G heads per KV head run as G rows of that head (no K/V repeat)
        out = F.scaled_dot_product_attention(q.to(cdt).view(1, hkv, hq // hkv, d), keys, values, scale=scale)
        return out.reshape(1, hq, d).to(q.dtype)


class BareForward:
    """The module's forward on one token at a time against a :class:`StaticKVAttention`, then its LM head."""

    def __init__(self, module, attn: StaticKVAttention, vocab: torch.Tensor | None) -> None:
        self.module, self.attn, self.vocab = module, attn, vocab
        device = attn.k.device
        self.ids = torch.full((1,), AUDIO_TOKEN, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)

    def step(self, position: int) -> tuple[float, float]:
        """The token at ``position`` (``position`` tokens cached before it): (wall, this thread's CPU) seconds."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self.pos.fill_(position)
        self.attn.length = position + 1
        hidden = self.module(self.ids, self.pos, self.attn)
        logits = self.module.compute_logits(hidden, self.vocab)
        self.ids.fill_(AUDIO_TOKEN + int(logits.argmax()))  # the LM head's result is read, as sampling does
        sync(self.attn.k.device)
        return time.perf_counter() - wall, time.thread_time() - cpu


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
