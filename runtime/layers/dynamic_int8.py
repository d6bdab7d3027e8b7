"""Dynamic int8 linears on CPU (``quantization: int8_dynamic``): int8 weights and int8 activations.

Each call quantizes its input to 8 bits on the fly (one scale for the whole input tensor, computed
from it) and multiplies int8 by int8 with int32 sums in fbgemm, torch's own x86 quantized backend
(``torch.ops.quantized.linear_dynamic``, as ``torch.ao.quantization.quantize_dynamic`` does); the
weights are quantized once, symmetric with one scale per output channel, and prepacked. llama.cpp's
Q8_0 also multiplies 8-bit activations by 8-bit weights, though with a scale per 32-value block of
each row (so no row depends on another). Unlike the weight-only kernels (mstar.layers.weight_only)
this stays fast at 8 rows.

The price: the activation scale is per input tensor, so with several rows in one call a row's result
depends on the others (batch-dependent numerics), and 8-bit activations lose more than weight-only
int8 (``mstar_ros.bench.quant_quality`` measures both). Heads read by row ranges (constrained
decoding) stay weight-only int8: fbgemm's packing cannot be sliced by rows.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

# fbgemm multiplies u8 x s8 pairs summed into int16 on CPUs without VNNI: 7-bit activations cannot
# saturate it (torch.ao's default for x86 dynamic quantization too)
REDUCE_RANGE = True


def dynamic_int8_available() -> bool:
    """torch's x86 quantized engine and its dynamic linear ops are in this build."""
    engines = torch.backends.quantized.supported_engines
    ops = torch.ops.quantized
    return ("fbgemm" in engines or "x86" in engines) and all(
        hasattr(ops, name) for name in ("linear_prepack", "linear_dynamic", "linear_unpack")
    )


class DynamicInt8Linear(nn.Module):
    """Drop-in for a CPU ``nn.Linear``: int8 weight (per output channel) prepacked for fbgemm; each
    call quantizes its input per tensor. Outputs in the input's dtype."""

    def __init__(self, linear: nn.Linear, name: str = "") -> None:
        super().__init__()
        weight = linear.weight.detach()
        if weight.device.type != "cpu":
            raise ValueError(f"int8_dynamic runs on CPU only; linear {name!r} is on {weight.device}")
        if not dynamic_int8_available():
            raise ValueError("int8_dynamic needs torch's fbgemm/x86 quantized engine, which this build lacks")
        self.in_features, self.out_features, self.name = linear.in_features, linear.out_features, name
        w = weight.float()
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
        with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors: docs/quantization.md says so
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
            qweight = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        self.bias = linear.bias  # packed too; kept for code that reads a linear's device and dtype off it
        bias = None if linear.bias is None else linear.bias.detach().float()
        self._packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        x2 = x2 if x2.dtype == torch.float32 and x2.is_contiguous() else x2.float().contiguous()
        out = torch.ops.quantized.linear_dynamic(x2, self._packed, REDUCE_RANGE)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight it multiplies by (fp32 [N, K]), for checks."""
        qweight, _bias = torch.ops.quantized.linear_unpack(self._packed)
        return qweight.dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8_dynamic"
