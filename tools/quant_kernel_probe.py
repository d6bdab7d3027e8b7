"""Quantized CPU linear kernels against the bf16 packed linear, on Orpheus linear shapes.

Candidates: bf16 oneDNN-packed (the engines' default on AVX512-BF16), torch's
``_weight_int8pack_mm`` (int8 weights, bf16 activations), ``_weight_int4pack_mm_for_cpu``
(int4 weights, group-wise scales), torch.ao dynamic int8 (int8 activations too, fp32 in/out,
fbgemm), fbgemm's fp16 weights (``quantization: fp16``), and torchao's weight-only configs when
``import torchao`` works (PYTHONPATH).

Run: MSTAR_TREE=$PWD OMP_NUM_THREADS=1 python tools/quant_kernel_probe.py [--shapes bench,3b] [--rounds 5]
Timings: the best of ``rounds`` interleaved rounds (every kernel in turn, ``reps`` calls each):
the cores are shared with other work, which only ever adds time, so the minimum is the
least disturbed figure; read the ratios to bf16 packed, not the ms. With ``--copies N`` each
kernel holds N distinct weights and every call takes the next, so the weights come from memory as
in a deep model's decode (one call's time and the GB/s of its weight's bf16 bytes are printed).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mstar.layers.fp16_weights import Fp16Linear, fp16_weights_available
from mstar.layers.linear_packing import packing_available
from mstar.layers.weight_only import WeightOnlyLinear, int4_fits

# (name, in_features, out_features): fused q|k|v, o, fused gate|up, down, LM head (whole / one
# 4096-token Orpheus audio slot, which constrained decoding reads per step)
SHAPES = {
    "bench": [
        ("qkv", 512, 1024),
        ("o", 512, 512),
        ("gate_up", 512, 3072),
        ("down", 1536, 512),
        ("head", 512, 156940),
        ("head_slot", 512, 4096),
    ],
    "decode": [  # bench decode's preset: hidden 768, 108 layers (weights out of cache: use --copies)
        ("qkv", 768, 1280),
        ("o", 768, 768),
        ("gate_up", 768, 4096),
        ("down", 2048, 768),
        ("head", 768, 156940),
    ],
    "3b": [
        ("qkv", 3072, 5120),
        ("o", 3072, 3072),
        ("gate_up", 3072, 16384),
        ("down", 8192, 3072),
        ("head", 3072, 156940),
        ("head_slot", 3072, 4096),
    ],
}


def _torchao_kernels(weight: torch.Tensor) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    try:
        import torchao  # noqa: F401
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except Exception as exc:  # not installed, or built against another torch
        print(f"# torchao unavailable: {type(exc).__name__}: {exc}")
        return {}
    kernels = {}
    configs = {"torchao_int8wo": lambda: Int8WeightOnlyConfig()}
    try:
        from torchao.dtypes import Int4CPULayout

        configs["torchao_int4wo_g128"] = lambda: Int4WeightOnlyConfig(group_size=128, layout=Int4CPULayout(), version=1)
    except Exception as exc:
        print(f"# torchao int4 CPU layout unavailable: {type(exc).__name__}: {exc}")
    for name, make in configs.items():
        lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.bfloat16)
        lin.weight.data.copy_(weight)
        try:
            quantize_(lin, make())
            lin(torch.zeros(1, weight.shape[1], dtype=torch.bfloat16))
            kernels[name] = lin
        except Exception as exc:
            print(f"# {name} failed: {type(exc).__name__}: {str(exc)[:160]}")
    return kernels


def kernels_for(weight: torch.Tensor, with_torchao: bool) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Every candidate for ``weight`` [N, K] (bf16), as callables on bf16 activations [M, K]."""
    kernels: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    if packing_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        kernels["bf16_packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    kernels["bf16_plain"] = lambda x: F.linear(x, weight)
    fp32 = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    fp32.weight.data.copy_(weight.float())
    plain = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.bfloat16)
    plain.weight.data.copy_(weight)
    kernels["int8_aten"] = WeightOnlyLinear(plain, "int8")  # torch's _weight_int8pack_mm
    for group in (32, 128):  # torch's _weight_int4pack_mm_for_cpu
        if int4_fits(weight.shape[1], group):
            kernels[f"int4_aten_g{group}"] = WeightOnlyLinear(plain, "int4", group=group)
    dyn = torch.ao.quantization.quantize_dynamic(nn.Sequential(fp32), {nn.Linear}, dtype=torch.qint8)[0]
    kernels["ao_dynamic_int8"] = lambda x: dyn(x.float()).to(torch.bfloat16)  # bf16 in/out, as the engine needs
    if fp16_weights_available():
        kernels["fp16_fbgemm"] = Fp16Linear(plain)  # bf16 in/out
    if with_torchao:
        kernels.update(_torchao_kernels(weight))
    return kernels


def time_kernels(copies: list[dict], x: torch.Tensor, rounds: int, reps: int) -> dict[str, float]:
    """Each kernel's best ms per call over interleaved rounds; a sample is ``reps`` calls of each copy."""
    samples: dict[str, list[float]] = {name: [] for name in copies[0]}
    with torch.inference_mode():
        for kernels in copies:
            for fn in kernels.values():
                fn(x)  # warm
        for _ in range(rounds):
            for name in samples:
                fns = [kernels[name] for kernels in copies]
                best = float("inf")
                for _ in range(reps):
                    start = time.perf_counter()
                    for fn in fns:
                        fn(x)
                    best = min(best, (time.perf_counter() - start) / len(fns))
                samples[name].append(best * 1000)
    return {name: min(v) for name, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="bench,3b")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-torchao", action="store_true")
    parser.add_argument("--copies", type=int, default=1, help="distinct weights per kernel, called in turn")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, cpu {torch.backends.cpu.get_cpu_capability()}, threads {args.threads}")
    print("# ms: best of interleaved rounds; x: time / bf16_packed time (lower is faster)")
    gen = torch.Generator().manual_seed(0)
    for preset in args.shapes.split(","):
        for name, k, n in SHAPES[preset]:
            copies = 1 if name == "head" else args.copies  # one head is already out of cache
            weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16) for _ in range(copies)]
            kernels = [kernels_for(w, not args.no_torchao) for w in weights]
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
                ms = time_kernels(kernels, x, args.rounds, args.reps)
                base = ms.get("bf16_packed", ms["bf16_plain"])
                cells = "  ".join(
                    f"{kn} {v:.3f} ({v / base:.2f}x, {2 * n * k / v / 1e6:.1f} GB/s)" for kn, v in ms.items()
                )
                print(f"{preset:5s} {name:9s} {k}x{n} M={m}: {cells}", flush=True)
            del kernels, weights


if __name__ == "__main__":
    main()
