"""``mstar-ros bench threads``: the pi0.5 forward in a fresh process vs after torch work on other threads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``threads`` under the ``bench`` command (call after mstar_ros.cli.bench.add_parser)."""
    from mstar_ros.bench.threads import MAX_RATIO

    p = bench_subparsers(sub).add_parser(
        "threads",
        help="model calls keep their speed after torch work on other threads (exit 1 if not)",
        description="The pi0.5 direct forward on the device thread, in a fresh process, timed before and "
        "after other threads built observations the way `bench pi05` does (a live helper thread, "
        "interleaved with rounds without it; then the main thread). Prints the ratio, context "
        "switches per forward and the OS threads the other threads' work added (an OpenMP team of "
        "its own: what slowed every model call 1.5-1.8x before), writes them to JSON and exits 1 "
        "when a team appeared or the ratio passes --max-ratio. About 20 s on the bench preset.",
    )
    p.add_argument(
        "--preset", default="bench", choices=["tiny", "bench"], help="generated checkpoint preset (default bench)"
    )
    p.add_argument(
        "--weights", type=Path, help="a real pi0.5 PyTorch checkpoint directory instead of the generated one"
    )
    add_dtype_argument(p, what="model dtype")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds with and without the helper (default 6)")
    p.add_argument(
        "--max-ratio",
        type=float,
        default=MAX_RATIO,
        help=f"fail when the forward after the other threads' work is slower than this (default {MAX_RATIO})",
    )
    p.add_argument(
        "--helper-threads",
        type=int,
        default=0,
        metavar="N",
        help="to see the check fail: the helper asks torch for N intra-op threads first, as a library "
        "calling torch.set_num_threads would (0, the default: what the runtime gives it)",
    )
    p.add_argument("--json", type=Path, default=Path("bench-threads.json"), help="where to write the figures")
    p.set_defaults(run=_run_threads)


def _run_threads(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.max_ratio <= 0 or args.helper_threads < 0:
        raise ValueError("--rounds must be >= 1, --max-ratio > 0 and --helper-threads >= 0")
    from mstar_ros.bench.threads import summary_lines, thread_slowdown_check

    report = thread_slowdown_check(
        preset=args.preset,
        weights=args.weights,
        dtype=args.dtype,
        rounds=args.rounds,
        helper_threads=args.helper_threads,
        max_ratio=args.max_ratio,
    )
    print("\n".join(summary_lines(report)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0 if report["ok"] else 1
