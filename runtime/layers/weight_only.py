"""Weight-only int8 / int4 linears on CPU: weights stored quantized, activations stay bf16 / fp32.

Decode is bound by reading weights (B = 1..8 rows against megabytes of weight), so fewer weight
bytes are fewer milliseconds. Kernels (chosen by ``tools/quant_kernel_probe.py``, table in
docs/quantization.md): torch's own ``_weight_int8pack_mm`` (int8, one symmetric scale per output
channel) and ``_weight_int4pack_mm_for_cpu`` (int4, one symmetric scale per output channel and
group of ``INT4_GROUP`` inputs). No extra dependency: torchao's CPU path calls the same ops.

``quantize_linears`` swaps a module's ``nn.Linear`` layers for :class:`WeightOnlyLinear` (the
engines call it where they pack bf16 linears). An LM head read by row ranges (constrained
decoding) is quantized too when the module names it in ``quantizable_heads``: it is then read
through :meth:`WeightOnlyLinear.rows` / :meth:`WeightOnlyLinear.gather`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from mstar.layers.dynamic_int8 import DynamicInt8Linear, dynamic_int8_available
from mstar.layers.fp16_weights import HEAD_BLOCK, Fp16Linear, fp16_weights_available

log = logging.getLogger("mstar.engine")

# int8_dynamic: mstar.layers.dynamic_int8; fp16: mstar.layers.fp16_weights (not integer, but the same swap)
QUANTIZATIONS = ("none", "int8", "int4", "int8_dynamic", "fp16")
# what a compiled forward runs (mstar.engine.compiled_forward): inductor lowers torch's weight-only int8 /
# int4 ops itself; int8_dynamic and fp16 are fbgemm's opaque packings
COMPILED_QUANTIZATIONS = ("none", "int8", "int4")
INT4_GROUP = 32  # inputs per int4 scale; 32 kept more accuracy than 128 at a similar speed (probe)
_INT4_BLOCK = 64  # rows torch's int4 CPU packing interleaves together: row ranges align to it
_INT4_ALIGN = 16  # the packing needs a row count that is a multiple of this
QUANTIZED_AS = "_mstar_quantized_as"  # set on a module quantize_linears has quantized: its mode


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (int8 [N, K], scale [N] in ``weight``'s dtype): symmetric, per output channel."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale.to(weight.dtype)


def _int4_codes(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> (codes 0..15 int32 [N, K] meaning code - 8, scale [N, K / group] fp32)."""
    n, k = weight.shape
    w = weight.detach().float().view(n, k // group, group)
    scale = (w.abs().amax(dim=-1) / 7).clamp(min=1e-12)
    codes = (torch.round(w / scale[..., None]).clamp(-8, 7) + 8).to(torch.int32)
    return codes.view(n, k), scale


def quantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] (N a multiple of 16) -> (torch's packed int4 [N, K / 2] uint8, scales_and_zeros
    [K / group, N, 2] in ``weight``'s dtype): symmetric, per output channel and input group."""
    codes, scale = _int4_codes(weight, group)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    # torch's int4 kernels compute (code - 8) * scale + zero: a zero of 0 keeps it symmetric
    scales_and_zeros = torch.stack([scale.T, torch.zeros_like(scale.T)], dim=-1).contiguous()
    return packed, scales_and_zeros.to(weight.dtype)


def dequantize_int4(weight: torch.Tensor, group: int = INT4_GROUP) -> torch.Tensor:
    """The weight that :func:`quantize_int4` represents (fp32), for checks."""
    codes, scale = _int4_codes(weight, group)
    n, k = weight.shape
    return ((codes.view(n, k // group, group) - 8).float() * scale[..., None]).view(n, k)


def int4_fits(in_features: int, group: int = INT4_GROUP) -> bool:
    return in_features % group == 0 and in_features % 2 == 0


class WeightOnlyLinear(nn.Module):
    """Drop-in for a CPU ``nn.Linear`` whose weight is held as int8 or int4 codes plus scales.

    Outputs are ``x @ dequantized(weight).T`` (+ bias) in ``x``'s dtype (bf16 or fp32); the
    weight itself is never rebuilt. CPU only: the kernels are torch's CPU weight-only ops.
    """

    def __init__(self, linear: nn.Linear, mode: str, name: str = "", group: int = INT4_GROUP) -> None:
        super().__init__()
        if mode not in ("int8", "int4"):
            raise ValueError(f"quantization must be 'int8' or 'int4', got {mode!r}")
        weight = linear.weight.detach()
        if weight.device.type != "cpu":
            raise ValueError(f"weight-only quantization runs on CPU only; linear {name!r} is on {weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.mode, self.name, self.group = mode, name, group
        self.bias = linear.bias
        if mode == "int8":
            q, scale = quantize_int8(weight)
        else:
            if not int4_fits(self.in_features, group):
                raise ValueError(f"int4 needs in_features divisible by {group}; linear {name!r} has {self.in_features}")
            pad = -self.out_features % _INT4_ALIGN  # zero rows, never read back
            padded = torch.cat([weight, weight.new_zeros(pad, self.in_features)]) if pad else weight
            q, scale = quantize_int4(padded, group)
        self.register_buffer("qweight", q)
        self.register_buffer("scales", scale)

    def _scales(self, x: torch.Tensor, lo: int | None = None, hi: int | None = None) -> torch.Tensor:
        scale = self.scales if lo is None else (self.scales[lo:hi] if self.mode == "int8" else self.scales[:, lo:hi])
        return scale if scale.dtype == x.dtype and scale.is_contiguous() else scale.to(x.dtype).contiguous()

    def _mm(self, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        if self.mode == "int8":
            return torch.ops.aten._weight_int8pack_mm(x2, qweight, scales)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, qweight, self.group, scales)

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype not in (torch.bfloat16, torch.float32):
            x2 = x2.float()
        return x2 if x2.is_contiguous() else x2.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = self._flat(x)
        out = self._mm(x2, self.qweight, self._scales(x2))
        if out.shape[1] != self.out_features:  # int4 padding rows
            out = out[:, : self.out_features]
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def row_runs(self, x: torch.Tensor, runs: list[tuple[int, int]]) -> torch.Tensor:
        """The columns of several row ranges side by side (``torch.cat`` of :meth:`rows` of each)."""
        return torch.cat([self.rows(x, lo, hi) for lo, hi in runs], dim=-1)

    def rows(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """``x [M, K] @ weight[lo:hi].T + bias[lo:hi]`` -> [M, hi - lo]: the columns ``forward`` gives."""
        x2 = self._flat(x)
        if self.mode == "int8":
            out = self._mm(x2, self.qweight[lo:hi], self._scales(x2, lo, hi))
        else:
            # int4 rows are packed in blocks of 64: compute the whole blocks, keep the asked rows
            a = lo - lo % _INT4_BLOCK
            b = min(-(-hi // _INT4_BLOCK) * _INT4_BLOCK, self.qweight.shape[0])
            out = self._mm(x2, self.qweight[a:b], self._scales(x2, a, b))[:, lo - a : hi - a]
        if self.bias is not None:
            out = out + self.bias[lo:hi].to(out.dtype)
        return out.to(x.dtype)

    def gather(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``x [M, K] @ weight[ids].T + bias[ids]`` -> [M, len(ids)] for scattered ids."""
        ids = ids.to(self.qweight.device, torch.long)
        if self.mode == "int8":
            x2 = self._flat(x)
            out = self._mm(x2, self.qweight.index_select(0, ids), self._scales(x2).index_select(0, ids))
            if self.bias is not None:
                out = out + self.bias.index_select(0, ids).to(out.dtype)
            return out.to(x.dtype)
        return self.forward(x).index_select(-1, ids)  # int4 rows cannot be gathered from the packing

    def extra_repr(self) -> str:
        group = f", group={self.group}" if self.mode == "int4" else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, {self.mode}{group}"
        )


def check_quantization(value: str, field: str = "quantization") -> str:
    """``value`` if it names a quantization, else ValueError naming ``field`` and the choices."""
    if value not in QUANTIZATIONS:
        raise ValueError(f"{field} = {value!r} is invalid (expected one of {', '.join(QUANTIZATIONS)})")
    return value


def check_quantization_device(mode: str, device: torch.device | str, owner: str) -> None:
    """Refuses weight-only ``mode`` on a device other than the CPU (its kernels are CPU ones, and
    ``quantize_linears`` would leave such linears as they are without a word)."""
    device = torch.device(device)
    if mode != "none" and device.type != "cpu":
        raise ValueError(f"{owner}: quantization {mode!r} runs on CPU only (device is {device.type!r})")


def quantize_linears(
    module: nn.Module, mode: str, keep_plain: tuple[str, ...] = (), heads: tuple[str, ...] = ()
) -> int:
    """Replaces ``module``'s CPU ``nn.Linear`` layers by :class:`WeightOnlyLinear` (``mode`` "int8" or
    "int4"; "none" does nothing); for "int8_dynamic", by :class:`DynamicInt8Linear` (the heads by
    weight-only int8: they are read by row ranges); for "fp16", by :class:`Fp16Linear` (heads packed
    in blocks of rows). Skipped: names in ``keep_plain`` unless also in
    ``heads`` (heads the module reads through ``rows``/``gather``), and linears sharing their weight
    with another module unless in ``heads`` (a tied LM head gets a quantized copy; the embedding keeps
    its weight). Under int4, a linear whose input width does not fit the groups gets int8. Returns how
    many it replaced."""
    check_quantization(mode)
    if mode == "none":
        return 0
    if mode == "int8_dynamic" and not dynamic_int8_available():
        raise ValueError("quantization 'int8_dynamic' needs torch's fbgemm/x86 quantized ops, which this build lacks")
    if mode == "fp16" and not fp16_weights_available():
        raise ValueError("quantization 'fp16' needs torch's fbgemm fp16 linear ops, which this build lacks")
    done = getattr(module, QUANTIZED_AS, None)
    if done not in (None, mode):
        # an engine quantizes in place: a module another engine quantized otherwise would keep that mode
        raise ValueError(
            f"quantization {mode!r}: the module is already quantized ({done}) by another engine given the "
            "same module; load it again for this one"
        )
    owners: dict[int, int] = {}
    for m in module.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    targets = [
        (name, m)
        for name, m in module.named_modules()
        if type(m) is nn.Linear
        and m.weight.device.type == "cpu"
        and (name in heads or (name not in keep_plain and owners[id(m.weight)] == 1))
    ]
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if mode == "int8_dynamic":
            swapped = WeightOnlyLinear(linear, "int8", name) if name in heads else DynamicInt8Linear(linear, name)
        elif mode == "fp16":  # heads in blocks of rows, so row ranges stay cheap
            swapped = Fp16Linear(linear, name, HEAD_BLOCK if name in heads else None)
        else:
            swapped = WeightOnlyLinear(
                linear, mode if mode == "int8" or int4_fits(linear.in_features) else "int8", name
            )
        setattr(parent, attr, swapped)
    setattr(module, QUANTIZED_AS, mode)
    return len(targets)


def quantize_module(module: nn.Module, mode: str) -> int:
    """:func:`quantize_linears` with the module's own ``plain_linears`` kept plain and its
    ``quantizable_heads`` quantized (NodeSubmodule class attributes; absent: none)."""
    return quantize_linears(
        module, mode, tuple(getattr(module, "plain_linears", ())), tuple(getattr(module, "quantizable_heads", ()))
    )


def quantized_count(module: nn.Module) -> int:
    """How many linears under ``module`` are quantized (weight-only, dynamic int8 or fp16)."""
    return sum(isinstance(m, WeightOnlyLinear | DynamicInt8Linear | Fp16Linear) for m in module.modules())
