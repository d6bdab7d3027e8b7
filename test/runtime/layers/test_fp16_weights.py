"""fp16 weights (mstar.layers.fp16_weights): the weight rounded once to fp16 and packed for fbgemm,
fp32 activations; heads packed in blocks of rows and read by ranges or scattered ids."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mstar.layers.fp16_weights import Fp16Linear
from mstar.layers.tensor_parallel import restricted_logits
from mstar.layers.weight_only import quantize_linears, quantized_count


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(n_in, n_out, bias=bias)


def _exact(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """fp32 x against the fp16-rounded weight (and bias), computed in fp64."""
    w = linear.weight.detach().half().double()
    out = x.double() @ w.T
    return out if linear.bias is None else out + linear.bias.detach().double()


def test_the_weight_is_the_fp16_rounding_of_the_linear():
    linear = _linear(64, 40)
    got = Fp16Linear(linear).dequantized_weight()
    assert torch.equal(got, linear.weight.detach().half().float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_is_the_fp16_weight_matmul_in_fp32(dtype):
    linear = _linear(256, 100)
    x = torch.randn(2, 3, 256).to(dtype)
    with torch.no_grad():
        got = Fp16Linear(linear)(x)
    assert got.shape == (2, 3, 100) and got.dtype == dtype
    exact = _exact(linear, x.float())
    # fp32 accumulation over 256 inputs: about 1e-6 of the output; bf16 outputs round to 8 bits
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert float((got.double() - exact).abs().max()) <= tol * float(exact.abs().max())


def test_weights_beyond_fp16s_range_are_refused_naming_the_linear():
    linear = _linear(16, 8)
    with torch.no_grad():
        linear.weight[3, 5] = 7e4
    with pytest.raises(ValueError, match=r"linear 'layers.0.proj' has a weight of magnitude 7e\+04, beyond fp16"):
        Fp16Linear(linear, "layers.0.proj")
    with torch.no_grad():
        linear.weight[3, 5] = float("nan")
    with pytest.raises(ValueError, match="beyond fp16's range"):
        Fp16Linear(linear, "layers.0.proj")


@pytest.mark.parametrize("bias", [False, True])
def test_a_head_in_blocks_reads_ranges_and_ids_as_the_whole_product(bias):
    linear = _linear(32, 100, bias=bias)
    head = Fp16Linear(linear, "lm_head", row_block=16)  # 7 blocks, the last one partial
    assert len(head._packs) == 7 and (head.bias is not None) == bias
    x = torch.randn(3, 32)
    with torch.no_grad():
        full = head(x)
        assert float((full.double() - _exact(linear, x)).abs().max()) < 1e-5
        for lo, hi in [(0, 100), (5, 9), (14, 40), (16, 32), (90, 100), (99, 100), (32, 32)]:
            assert torch.equal(head.rows(x, lo, hi), full[:, lo:hi]), (lo, hi)
        runs = [(2, 3), (20, 52), (40, 41), (97, 100), (50, 50)]  # sharing blocks, overlapping, empty
        assert torch.equal(head.row_runs(x, runs), torch.cat([full[:, lo:hi] for lo, hi in runs], dim=-1))
        ids = torch.tensor([97, 3, 50, 3, 17, 64])  # unsorted, repeated, across blocks
        assert torch.equal(head.gather(x, ids), full[:, ids])
        assert head.gather(x, ids[:0]).shape == (3, 0)
        # as constrained decoding reads it: a few runs as row ranges, scattered ids (> MAX_RUNS runs) gathered
        assert torch.equal(restricted_logits(x, head, torch.arange(20, 70)), full[:, 20:70])
        assert torch.equal(restricted_logits(x, head, ids), full[:, ids])
        scattered = torch.arange(1, 100, 9)  # 11 runs of one id
        assert torch.equal(restricted_logits(x, head, scattered), full[:, scattered])
        assert torch.equal(restricted_logits(x, head, None), full)
        with pytest.raises(IndexError, match="rows \\[90, 101\\) are outside linear 'lm_head'"):
            head.rows(x, 90, 101)
        with pytest.raises(IndexError, match="ids outside linear 'lm_head'"):
            head.gather(x, torch.tensor([5, -1]))


def test_fp16_swaps_the_body_whole_and_the_heads_in_blocks_and_keeps_the_rest():
    model = nn.Sequential()
    model.add_module("proj", _linear(64, 64))
    model.add_module("lm_head", _linear(64, 5000, bias=False))
    model.add_module("keep", _linear(64, 8))
    assert quantize_linears(model, "fp16", keep_plain=("keep",), heads=("lm_head",)) == 2
    assert isinstance(model.proj, Fp16Linear) and len(model.proj._packs) == 1
    assert isinstance(model.lm_head, Fp16Linear) and model.lm_head.row_block == 2048
    assert len(model.lm_head._packs) == 3
    assert type(model.keep) is nn.Linear and quantized_count(model) == 2
