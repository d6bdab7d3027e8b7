"""``mstar-ros bench bagel``: BAGEL served by the runtime vs the reference inferencer's algorithm, same run."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers, positive_ints, write_report
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    from mstar_ros.bench.bagel import BagelBenchOptions

    d = BagelBenchOptions()
    p = bench_subparsers(sub).add_parser(
        "bagel",
        help="BAGEL: editing, text to image and image to text vs the reference's algorithm on the same modules",
        description="Editing and text to image at one request (our three views evaluated in one engine step vs "
        "the reference's three batch-1 forwards per flow step, each context with its own KV), the bound of that "
        "speedup measured directly (one forward over the branches' rows together vs separate forwards), and "
        "image to text at --concurrency levels (time to first token, tokens/s) vs the reference's chat loop one "
        "request at a time. Same module objects, kernels and guidance code in both. Writes JSON and a PNG.",
    )
    p.add_argument("--preset", default="bench", choices=["tiny", "bench"], help="generated checkpoint (default bench)")
    p.add_argument("--weights", type=Path, help="a BAGEL checkpoint directory instead (e.g. BAGEL-7B-MoT)")
    p.add_argument(
        "--image-size",
        type=int,
        help="pixels per image side (default: the model's largest, 512 for the bench preset); smaller for a "
        "quicker run while developing",
    )
    p.add_argument(
        "--steps", type=int, default=d.steps, help=f"flow schedule points: steps - 1 evaluations (default {d.steps})"
    )
    p.add_argument("--repeats", type=int, default=d.repeats, help=f"runs of each system per image task ({d.repeats})")
    p.add_argument(
        "--bound-repeats", type=int, default=d.bound_repeats, help=f"timings per bound forward ({d.bound_repeats})"
    )
    p.add_argument(
        "--answer-tokens",
        type=int,
        default=d.answer_tokens,
        help=f"tokens per image-to-text answer ({d.answer_tokens}, the reference app's max_new_tokens; random "
        "weights run every answer to it in both systems)",
    )
    p.add_argument(
        "--concurrency", type=positive_ints, default=d.concurrency, help="image-to-text levels (default 1,8)"
    )
    p.add_argument("--chat-rounds", type=int, default=d.chat_rounds, help=f"requests timed at C = 1 ({d.chat_rounds})")
    p.add_argument(
        "--baseline-chats",
        type=int,
        default=d.baseline_chats,
        help=f"reference chat requests, half before ours, half after ({d.baseline_chats})",
    )
    p.add_argument(
        "--max-batched-tokens",
        type=int,
        help="ours' engine token budget per step (default: 1024, or more so that an image question's prefill fits "
        "beside running decodes: its ViT span cannot be split over steps)",
    )
    add_dtype_argument(p, what="compute dtype of both systems (they run the same module objects)")
    p.add_argument("--json", type=Path, default=Path("bench-bagel.json"), help="where to write the figures")
    p.add_argument("--plot", type=Path, default=Path("bench-bagel.png"), help="where to write the plot")
    p.add_argument(
        "--quick", action="store_true", help="a small run for smoke tests (tiny preset, 3 points, 4 tokens, C 1,2)"
    )
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mstar_ros.bench.bagel import BagelBenchOptions, check_options, run_bagel_bench
    from mstar_ros.bench.bagel_plot import plot_bagel
    from mstar_ros.bench.bagel_summary import summary_lines

    opts = BagelBenchOptions(
        preset=args.preset,
        weights=str(args.weights) if args.weights else None,
        image_size=args.image_size,
        steps=args.steps,
        repeats=args.repeats,
        bound_repeats=args.bound_repeats,
        answer_tokens=args.answer_tokens,
        concurrency=args.concurrency,
        chat_rounds=args.chat_rounds,
        baseline_chats=args.baseline_chats,
        max_batched_tokens=args.max_batched_tokens,
        dtype=args.dtype,
    )
    if args.quick:
        opts.preset, opts.steps, opts.answer_tokens, opts.concurrency = "tiny", 3, 4, [1, 2]
        opts.bound_repeats, opts.chat_rounds, opts.baseline_chats = 1, 1, 2
    check_options(opts)
    report = run_bagel_bench(opts)
    write_report(report, summary_lines(report), args.json, plot_bagel, args.plot)
    return 0
