"""``measure_step_overhead`` in quick form (tiny checkpoint), and the bare forward's static-KV attention.

The ratio is reported, not bounded (timings on the shared 2-core machines swing 2-4x)."""

import torch
import torch.nn.functional as F

from mstar_ros.bench.bare_forward import StaticKVAttention
from mstar_ros.bench.step_overhead import measure_step_overhead


def test_static_kv_attention_is_dense_attention_over_the_cached_keys():
    hkv, hq, d, n = 2, 6, 8, 5
    attn = StaticKVAttention(2, hkv, d, 16, torch.float32, None, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    attn.k[1, :, : n - 1] = keys[:-1].transpose(0, 1)
    attn.v[1, :, : n - 1] = values[:-1].transpose(0, 1)
    q = torch.randn(1, hq, d, generator=g)
    attn.length = n
    out = attn(1, q, keys[-1:], values[-1:], 0.3)
    k = keys.transpose(0, 1).repeat_interleave(hq // hkv, 0)  # [hq, n, d]
    v = values.transpose(0, 1).repeat_interleave(hq // hkv, 0)
    ref = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, scale=0.3).transpose(0, 1)
    torch.testing.assert_close(out, ref)
    assert torch.equal(attn.k[1, :, n - 1], keys[-1])  # the step's key was cached


def test_measure_step_overhead_quick():
    result = measure_step_overhead(None, preset="tiny", dtype="float32", steps=3, context=8, rounds=2, greedy=True)
    assert result["engine_step_ms"] > 0 and result["bare_forward_ms"] > 0
    assert abs(result["step_overhead_b1"] - result["engine_step_ms"] / result["bare_forward_ms"]) < 0.01
    assert len(result["rounds_engine_ms"]) == len(result["rounds_bare_ms"]) == 2
    assert result["dtype"] == "float32" and result["context"] == 8
