"""Weight-only int8 / int4 linears: outputs against the dequantized weight, row ranges, module swap."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mstar.layers.tensor_parallel import restricted_logits
from mstar.layers.weight_only import (
    WeightOnlyLinear,
    check_quantization,
    dequantize_int4,
    quantize_int8,
    quantize_linears,
    quantized_count,
)


def _linear(n_in: int, n_out: int, bias: bool = False, dtype: torch.dtype = torch.float32) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(n_in, n_out, bias=bias).to(dtype)


def _dequantized(linear: nn.Linear, mode: str) -> torch.Tensor:
    if mode == "int8":
        q, scale = quantize_int8(linear.weight)
        return q.float() * scale.float()[:, None]
    return dequantize_int4(linear.weight)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_matches_the_dequantized_weight_matmul(mode, dtype):
    linear = _linear(64, 100, bias=True, dtype=dtype)  # 100 rows: int4 pads to a multiple of 16
    quantized = WeightOnlyLinear(linear, mode)
    x = torch.randn(2, 3, 64).to(dtype)
    expected = x.float() @ _dequantized(linear, mode).T + linear.bias.float()
    with torch.no_grad():
        got = quantized(x)
    assert got.shape == (2, 3, 100) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(got.float(), expected, rtol=tol, atol=tol)
    # and it is close to the original weight: quantization error, not a wrong layout
    full = x.float() @ linear.weight.float().T + linear.bias.float()
    assert float((got.float() - full).abs().max()) < (0.05 if mode == "int8" else 0.3)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_row_ranges_and_gathers_equal_the_full_columns(mode, bias):
    linear = _linear(64, 300, bias=bias)  # with a bias, every path adds its entries, as forward does
    head = WeightOnlyLinear(linear, mode)
    x = torch.randn(3, 64)
    full = head(x)
    for lo, hi in ((0, 300), (5, 17), (64, 128), (100, 299), (299, 300)):
        torch.testing.assert_close(head.rows(x, lo, hi), full[:, lo:hi], rtol=1e-5, atol=1e-5)
    ids = torch.tensor([299, 0, 77, 150])
    torch.testing.assert_close(head.gather(x, ids), full[:, ids], rtol=1e-5, atol=1e-5)
    sorted_ids = torch.cat([torch.arange(10, 80), torch.tensor([290])])
    torch.testing.assert_close(restricted_logits(x, head, sorted_ids), full[:, sorted_ids], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(restricted_logits(x, head, None), full)


def test_quantize_linears_swaps_linears_and_a_tied_head_but_not_plain_ones():
    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(48, 32)
            self.proj = nn.Linear(32, 32)
            self.kept = nn.Linear(32, 32)
            self.head = nn.Linear(32, 48, bias=False)
            self.head.weight = self.embed.weight  # tied

    module = Tiny()
    embed = module.embed.weight.detach().clone()
    assert quantize_linears(module, "none") == 0
    assert quantize_linears(module, "int8", keep_plain=("kept", "head"), heads=("head",)) == 2
    assert isinstance(module.proj, WeightOnlyLinear) and isinstance(module.head, WeightOnlyLinear)
    assert type(module.kept) is nn.Linear
    assert torch.equal(module.embed.weight, embed), "the embedding keeps its own weight"
    assert quantized_count(module) == 2
    untied = Tiny()
    quantize_linears(untied, "int4")
    assert type(untied.head) is nn.Linear, "a shared weight not named a head stays plain"


def test_int4_falls_back_to_int8_where_groups_do_not_fit():
    module = nn.Sequential(nn.Linear(40, 16), nn.Linear(16, 64))
    quantize_linears(module, "int4")
    assert (module[0].mode, module[1].mode) == ("int8", "int8")  # 40 and 16 are not multiples of 32
    module = nn.Sequential(nn.Linear(64, 16))
    quantize_linears(module, "int4")
    assert module[0].mode == "int4"


def test_unknown_quantization_names_the_field():
    with pytest.raises(ValueError, match=r"quantization = 'int3'.*none, int8, int4, int8_dynamic, fp16"):
        check_quantization("int3")


def test_a_plain_head_with_a_bias_adds_it_on_every_path():
    head = _linear(64, 300, bias=True)
    x = torch.randn(3, 64)
    with torch.no_grad():
        full = head(x)
        for ids in (None, torch.tensor([299, 0, 77]), torch.arange(10, 80)):
            expected = full if ids is None else full[:, ids]
            torch.testing.assert_close(restricted_logits(x, head, ids), expected, rtol=1e-5, atol=1e-5)
