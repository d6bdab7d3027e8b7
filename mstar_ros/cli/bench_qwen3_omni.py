"""``mstar-ros bench qwen3-omni``: Qwen3-Omni served by the runtime vs transformers' generate, same run."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar.engine.dtype_names import DTYPE_NAMES
from mstar_ros.cli.bench import bench_subparsers, positive_ints, write_report
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = bench_subparsers(sub).add_parser(
        "qwen3-omni",
        help="Qwen3-Omni: time to first audio and throughput vs transformers generate(return_audio=True)",
        description="C text requests at once (--concurrency levels), --rounds times, through the Conductor (Thinker, "
        "Talker with its code predictor and Code2Wav, each batched across requests), against transformers' "
        "Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True) on the same checkpoint, one request "
        "after another (its only mode). Prints time to first audio p50/p95, RTF, audio seconds per second "
        "and the goals; writes JSON and a PNG.",
    )
    p.add_argument("--concurrency", type=positive_ints, default=[1, 2, 4, 8], help="levels (default 1,2,4,8)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of C requests per level (default 2)")
    p.add_argument("--thinker-tokens", type=int, default=16, help="reply tokens per request (default 16)")
    p.add_argument("--talker-tokens", type=int, default=64, help="Talker frames per request (default 64: ~5 s)")
    p.add_argument(
        "--baseline-requests",
        type=int,
        default=4,
        help="transformers requests timed, half before ours and half after (default 4)",
    )
    p.add_argument("--preset", default="bench", choices=["tiny", "bench"], help="generated checkpoint (default bench)")
    p.add_argument("--weights", type=Path, help="a transformers Qwen3-Omni checkpoint directory instead")
    p.add_argument(
        "--first-chunk",
        type=int,
        default=None,
        help="frames in Code2Wav's first chunk (default 25, as the reference's chunking)",
    )
    add_dtype_argument(p, what="our compute dtype")
    p.add_argument(
        "--baseline-dtype",
        default="fastest",
        choices=["fastest", *DTYPE_NAMES],
        help="transformers' dtype: fastest (default: float32 and bfloat16 timed on one request each, the "
        "faster kept), auto (as ours would decide here), or a dtype",
    )
    p.add_argument(
        "--placement",
        type=Path,
        help="ours in Worker processes per this placement (e.g. config/placement/qwen3-omni-two-ranks.yaml)",
    )
    p.add_argument(
        "--talker-after-reply",
        action="store_true",
        help="start our Talker once the Thinker's reply is complete, as the reference does (default: the "
        "Talker starts on the reply's first token and reads the rest as it is made)",
    )
    p.add_argument("--json", type=Path, default=Path("bench-qwen3-omni.json"), help="where to write the figures")
    p.add_argument("--plot", type=Path, default=Path("bench-qwen3-omni.png"), help="where to write the plot")
    p.add_argument("--quick", action="store_true", help="a small run for smoke tests (tiny preset, C 1,2, 1 round)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mstar_ros.bench.qwen3_omni import OmniBenchOptions, run_omni_bench, summary_lines
    from mstar_ros.bench.qwen3_omni_plot import plot_omni

    if args.rounds < 1 or args.thinker_tokens < 2 or args.talker_tokens < 2 or args.baseline_requests < 1:
        raise ValueError("--rounds >= 1, --thinker-tokens >= 2, --talker-tokens >= 2, --baseline-requests >= 1")
    opts = OmniBenchOptions(
        concurrency=args.concurrency,
        rounds=args.rounds,
        thinker_tokens=args.thinker_tokens,
        talker_tokens=args.talker_tokens,
        baseline_requests=args.baseline_requests,
        preset=args.preset,
        weights=str(args.weights) if args.weights else None,
        first_chunk=args.first_chunk,
        dtype=args.dtype,
        baseline_dtype=args.baseline_dtype,
        placement=str(args.placement) if args.placement else None,
        talker_after_reply=args.talker_after_reply,
    )
    if args.quick:
        opts.preset, opts.concurrency, opts.rounds, opts.talker_tokens, opts.baseline_requests = (
            "tiny",
            [1, 2],
            1,
            30,
            2,
        )
    report = run_omni_bench(opts)
    write_report(report, summary_lines(report), args.json, plot_omni, args.plot)
    return 0
