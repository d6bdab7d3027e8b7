"""fp16 weights on CPU (``quantization: fp16``): linears through fbgemm's packed fp16 GEMM.

The weight is rounded once to fp16 and prepacked for fbgemm (``torch.ops.quantized.linear_prepack_fp16``,
torch's own x86 backend, as ``torch.ao.quantization.quantize_dynamic`` does with ``float16``); each
call multiplies fp32 activations by it, accumulating in fp32. The weight takes the bytes of bf16, and
loses less: fp16 keeps 3 more mantissa bits than bf16, so a bf16 checkpoint's weights convert exactly
within fp16's range (down to 6e-5; smaller ones lose low bits), and the activations stay fp32 inside
the matmul. llama.cpp's F16 stores its weights this way too.

Why: at one row (one-stream decode) fbgemm's kernel reads the weight at 17-34 GB/s on this 2-core
machine, 0.77-0.95x the time of oneDNN's prepacked bf16 (``mstar.layers.linear_packing``); at 8 rows
it takes 1.10-1.28x bf16's time (``docs/quantization.md`` has the figures). A weight beyond fp16's
range (65504) is refused, naming the linear, rather than saturated.

Heads read by row ranges (constrained decoding, ``restricted_logits``) are packed in blocks of
``HEAD_BLOCK`` rows, as packing cannot be sliced: a range computes the blocks it touches.
"""

from __future__ import annotations

import torch
from torch import nn

FP16_MAX = 65504.0
HEAD_BLOCK = 2048  # rows per packed block of a head: a 4096-row slot touches 3 (2 of 4096 would cost 1.6x), a
# full 157k-row head takes 1.06x the time of one packing


def fp16_weights_available() -> bool:
    """torch's fbgemm engine and its fp16 linear ops are in this build (x86 builds)."""
    ops = torch.ops.quantized
    return (
        "fbgemm" in torch.backends.quantized.supported_engines
        and torch.backends.quantized.engine in ("fbgemm", "x86")  # the packing is fbgemm's
        and all(hasattr(ops, name) for name in ("linear_prepack_fp16", "linear_dynamic_fp16", "linear_unpack_fp16"))
    )


class Fp16Linear(nn.Module):
    """Drop-in for a CPU ``nn.Linear`` with its weight (and bias) prepacked as fp16 for fbgemm; outputs
    in the input's dtype. With ``row_block``, packed in blocks of that many output rows, and readable by
    row ranges (:meth:`rows`) and scattered rows (:meth:`gather`) like a weight-only head."""

    def __init__(self, linear: nn.Linear, name: str = "", row_block: int | None = None) -> None:
        super().__init__()
        weight = linear.weight.detach()
        if weight.device.type != "cpu":
            raise ValueError(f"fp16 weights run on CPU only; linear {name!r} is on {weight.device}")
        if not fp16_weights_available():
            raise ValueError("quantization 'fp16' needs torch's fbgemm fp16 linear ops, which this build lacks")
        w = weight.float()
        peak = float(w.abs().max()) if w.numel() else 0.0
        # before packing: fbgemm would saturate such weights (in place, in an fp32 model's own tensor)
        if not peak <= FP16_MAX:  # also catches NaN
            raise ValueError(
                f"linear {name!r} has a weight of magnitude {peak:.3g}, beyond fp16's range ({FP16_MAX:g})"
            )
        self.in_features, self.out_features, self.name = linear.in_features, linear.out_features, name
        self.bias = linear.bias  # packed too; kept for code that reads a linear's device and dtype off it
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.row_block = row_block or self.out_features
        self._packs = [
            torch.ops.quantized.linear_prepack_fp16(
                w[lo : lo + self.row_block].contiguous(), None if bias is None else bias[lo : lo + self.row_block]
            )
            for lo in range(0, self.out_features, self.row_block)
        ]

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        return x2 if x2.dtype == torch.float32 and x2.is_contiguous() else x2.float().contiguous()

    def _blocks(self, x2: torch.Tensor, blocks: range | list[int]) -> torch.Tensor:
        """Output columns of ``blocks`` side by side (fp32 [M, their rows])."""
        outs = [torch.ops.quantized.linear_dynamic_fp16(x2, self._packs[b]) for b in blocks]
        if not outs:
            return x2.new_zeros(x2.shape[0], 0)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def _check_rows(self, lo: int, hi: int) -> None:
        if not 0 <= lo <= hi <= self.out_features:
            raise IndexError(f"rows [{lo}, {hi}) are outside linear {self.name!r}'s {self.out_features} rows")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._blocks(self._flat(x), range(len(self._packs)))
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def rows(self, x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """``x [M, K] @ weight[lo:hi].T + bias[lo:hi]`` -> [M, hi - lo]: the columns ``forward`` gives."""
        return self.row_runs(x, [(lo, hi)])

    def row_runs(self, x: torch.Tensor, runs: list[tuple[int, int]]) -> torch.Tensor:
        """The columns of several row ranges side by side (``torch.cat`` of :meth:`rows` of each),
        computing each block they touch once (an Orpheus slot and its end token share one)."""
        for lo, hi in runs:
            self._check_rows(lo, hi)
        touched = sorted({b for lo, hi in runs for b in range(lo // self.row_block, -(-hi // self.row_block))})
        out = self._blocks(self._flat(x), touched)
        first_column = {b: i * self.row_block for i, b in enumerate(touched)}  # of each block in ``out``
        # a run's blocks are consecutive in ``touched`` and all but the last block are full, so a run's
        # columns are one slice of ``out``
        parts = [
            out[:, first_column[lo // self.row_block] + lo % self.row_block :][:, : hi - lo]
            for lo, hi in runs
            if hi > lo
        ]
        if not parts:
            return x.new_zeros(out.shape[0], 0)
        return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)).to(x.dtype)

    def gather(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``x [M, K] @ weight[ids].T + bias[ids]`` -> [M, len(ids)] for scattered ids: only the blocks
        holding them are computed."""
        ids = ids.to(torch.long).cpu()
        if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < self.out_features):
            raise IndexError(f"ids outside linear {self.name!r}'s {self.out_features} rows")
        blocks = torch.unique(ids // self.row_block)
        outs = self._blocks(self._flat(x), blocks.tolist())
        # column of id i in ``outs``: its block's position among ``blocks`` times the block, plus its offset
        where = torch.searchsorted(blocks, ids // self.row_block) * self.row_block + ids % self.row_block
        return outs.index_select(-1, where).to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight it multiplies by (fp32 [N, K]), for checks."""
        return torch.cat([torch.ops.quantized.linear_unpack_fp16(p)[0] for p in self._packs])

    def extra_repr(self) -> str:
        blocks = f", row_block={self.row_block}" if len(self._packs) > 1 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp16{blocks}"
