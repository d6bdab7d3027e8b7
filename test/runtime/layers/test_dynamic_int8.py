"""Dynamic int8 linears (mstar.layers.dynamic_int8): int8 weights per output channel, activations
quantized per call; the module swap under ``quantization: int8_dynamic`` (heads stay weight-only)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mstar.layers.dynamic_int8 import DynamicInt8Linear
from mstar.layers.weight_only import WeightOnlyLinear, quantize_int8, quantize_linears, quantized_count


def _linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(n_in, n_out, bias=bias)


def test_the_weight_is_the_per_channel_int8_one():
    linear = _linear(64, 40)
    q, scale = quantize_int8(linear.weight)
    got = DynamicInt8Linear(linear).dequantized_weight()
    torch.testing.assert_close(got, q.float() * scale.float()[:, None], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_is_the_int8_weight_matmul_up_to_8_bit_activations(dtype):
    linear = _linear(256, 100)
    dynamic = DynamicInt8Linear(linear)
    x = torch.randn(2, 3, 256)
    with torch.no_grad():
        got = dynamic(x.to(dtype))
    assert got.shape == (2, 3, 100) and got.dtype == dtype
    exact = x @ dynamic.dequantized_weight().T + linear.bias.detach()
    err = float((got.float() - exact).abs().max()) / float(exact.abs().max())
    # 7-bit activations (reduce_range) over 256 inputs: about 1% of the output's range; a wrong
    # layout or scale would be off by the output's whole size
    assert err < 0.03, err
    assert float((got.float() - exact).abs().mean()) < 0.01 * float(exact.abs().mean()) + 0.01


def test_int8_dynamic_swaps_the_body_and_keeps_heads_weight_only():
    model = nn.Sequential()
    model.add_module("proj", _linear(64, 64))
    model.add_module("lm_head", _linear(64, 500, bias=False))
    model.add_module("keep", _linear(64, 8))
    assert quantize_linears(model, "int8_dynamic", keep_plain=("keep",), heads=("lm_head",)) == 2
    assert isinstance(model.proj, DynamicInt8Linear)
    assert isinstance(model.lm_head, WeightOnlyLinear) and model.lm_head.mode == "int8"
    assert type(model.keep) is nn.Linear and quantized_count(model) == 2


def test_a_module_quantized_otherwise_already_is_refused_not_kept_as_it_is():
    model = nn.Sequential()
    model.add_module("proj", _linear(64, 64))
    quantize_linears(model, "int8")
    with pytest.raises(
        ValueError, match=r"quantization 'int8_dynamic': the module is already quantized \(int8\) by another"
    ):
        quantize_linears(model, "int8_dynamic")
    assert quantize_linears(model, "int8") == 0  # the same mode again: nothing left to do, nothing refused
