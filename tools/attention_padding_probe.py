"""One layer of the torch attention backend on BAGEL-like shapes (bench preset: 7 query heads over one
KV head of 128): sequences of very different context lengths planned together vs one by one.

Run: MSTAR_TREE=$PWD OMP_NUM_THREADS=1 python tools/attention_padding_probe.py (bf16 cache, fp32
compute, best of 3 plan + forward).
"""

from __future__ import annotations

import math
import time

import torch

from mstar.engine.attention.metadata import AttentionMetadata, SeqAttention
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.kv_cache import KVSpec, PagedKVCache

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 7, 1, 128, 16
CASES = {
    "edit flow: 3 branches, ctx 3298/3279/1045, 1026 rows each": [(3298, 1026), (3279, 1026), (1045, 1026)],
    "t2i flow: 2 branches, ctx 1049/1026": [(1049, 1026), (1026, 1026)],
    "decodes: 1 at 3298 keys + 7 at 20..26 keys": [(3298, 1)] + [(20 + i, 1) for i in range(7)],
}


def step_inputs(specs: list[tuple[int, int]]) -> tuple[list[SeqAttention], torch.Tensor, int]:
    """(context_len, query_len) pairs -> sequences (query rows one bidirectional span), slots, blocks."""
    seqs, slots, row, blocks = [], [], 0, 0
    for ctx, ql in specs:
        table = list(range(blocks, blocks + -(-ctx // BLOCK)))
        blocks += len(table)
        seqs.append(SeqAttention(row, ql, ctx, table, spans=((ctx - ql, ctx),) if ql > 1 else ()))
        slots += [table[j // BLOCK] * BLOCK + j % BLOCK for j in range(ctx - ql, ctx)]
        row += ql
    return seqs, torch.tensor(slots), blocks


def time_step(specs: list[tuple[int, int]], repeats: int = 3) -> float:
    """Best milliseconds of plan + one layer's forward over the sequences together."""
    seqs, slots, blocks = step_inputs(specs)
    cache = PagedKVCache(KVSpec(num_layers=1, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM), blocks, BLOCK, torch.bfloat16)
    cache.k[0].normal_()
    cache.v[0].normal_()
    backend = TorchAttentionBackend(cache)
    rows = len(slots)
    q = torch.randn(rows, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    k, v = (torch.randn(rows, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    best = math.inf
    for _ in range(repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        backend.plan(AttentionMetadata(seqs, slots))
        backend.forward(0, q, k, v, 1 / math.sqrt(HEAD_DIM))
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    for name, specs in CASES.items():
        together = time_step(specs)
        alone = sum(time_step([s]) for s in specs)
        print(f"{name}: together {together:.1f} ms, one by one {alone:.1f} ms")


if __name__ == "__main__":
    main()
