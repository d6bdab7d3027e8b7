"""``mstar-ros bench decode``: Orpheus LLM decode tokens/s, ours bf16/int8/int4 vs llama.cpp F16/Q8_0/Q4_K_M."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers, positive_ints, write_report
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = bench_subparsers(sub).add_parser(
        "decode",
        help="Orpheus LLM decode tokens/s: ours (bf16, fp16, int8, int8_dynamic, int4) vs llama.cpp (F16, Q8_0, Q4_K_M)",
        description="C independent greedy streams of token ids (C = 1 and 8) through our AR engine and through "
        "llama.cpp (llama-cpp-python, batched decode with one sequence id per stream) on the same checkpoint, "
        "exported to GGUF by us and quantized by llama.cpp; same threads, interleaved rounds, medians. The "
        "default preset keeps the real 3B's LM-head share (~15%). Prints int8_vs_q8_c1, best_vs_q4km_c1, "
        "best_vs_q4km_c8 and step_overhead_b1; writes JSON and a PNG.",
    )
    p.add_argument("--preset", default="decode", help="generated Orpheus checkpoint (default decode)")
    p.add_argument("--weights", type=Path, help="an Orpheus LLM directory (HF layout) instead")
    p.add_argument("--levels", type=positive_ints, default=[1, 8], help="concurrent streams (default 1,8)")
    p.add_argument("--tokens", type=int, default=128, help="tokens per stream (default 128)")
    p.add_argument("--prompt-tokens", type=int, default=8, help="prompt length in ids (default 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every system (default 3)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of both systems (default 2)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed")
    p.add_argument("--no-step-overhead", action="store_true", help="skip measure_step_overhead")
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="run our forward eager (default: compiled where it can -- bf16, int8, int4 -- with its weights "
        "frozen and GEMM kernels tuned by measuring, which takes minutes per variant on 2 cores the first time)",
    )
    add_dtype_argument(p, what="our compute dtype (the int8/int4 variants keep it for what they do not quantize)")
    p.add_argument("--json", type=Path, default=Path("bench-decode.json"), help="where to write the figures")
    p.add_argument("--plot", type=Path, default=Path("bench-decode.png"), help="where to write the plot")
    p.add_argument("--quick", action="store_true", help="a small run for smoke tests (tiny preset, 16 tokens, 1 round)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mstar_ros.bench.decode import DecodeBenchOptions, run_decode_bench, summary_lines
    from mstar_ros.bench.decode_plot import plot_decode

    if args.tokens < 2 or args.prompt_tokens < 1 or args.rounds < 1 or args.threads < 1:
        raise ValueError("--tokens >= 2, --prompt-tokens >= 1, --rounds >= 1 and --threads >= 1 are needed")
    opts = DecodeBenchOptions(
        preset=args.preset,
        weights=args.weights,
        levels=args.levels,
        new_tokens=args.tokens,
        prompt_tokens=args.prompt_tokens,
        rounds=args.rounds,
        threads=args.threads,
        dtype=args.dtype,
        seed=args.seed,
        step_overhead=not args.no_step_overhead,
        compile=False if args.no_compile else "auto",
    )
    if args.quick:
        opts.preset, opts.new_tokens, opts.rounds = "tiny", 16, 1
        opts.llama_extra_buffers = False  # the tiny shapes crash llama.cpp's AMX buffers (LlamaCppDecoder)
        opts.compile = False  # compiling three variants would take longer than the run
    report = run_decode_bench(opts, quick=args.quick)
    write_report(report, summary_lines(report), args.json, plot_decode, args.plot)
    return 0
