"""``mstar-ros bench``: benchmarks that measure us against a baseline in the same run."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.bench.report_files import write_report  # noqa: F401 (the bench commands import it from here)
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (ratios against a baseline measured in the same run)")
    which = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    o = which.add_parser(
        "orpheus",
        help="Orpheus TTS serving vs transformers generate() + snac",
        description="Orpheus TTS at several concurrencies against the CPU baseline "
        "(transformers generate() + snac decode; sequential and statically batched), "
        "same checkpoint and workload. Writes every figure to JSON and a PNG plot.",
    )
    o.add_argument("--json", type=Path, default=Path("bench-orpheus.json"), help="where to write the figures")
    o.add_argument("--plot", type=Path, default=Path("bench-orpheus.png"), help="where to write the plot")
    o.add_argument("--concurrency", default="1,4,8,16", help="comma-separated concurrency levels (default 1,4,8,16)")
    o.add_argument("--requests", type=int, default=24, help="requests per level (default 24)")
    o.add_argument("--preset", default="bench", help="generated checkpoint preset (default bench)")
    o.add_argument("--weights", type=Path, help="real Orpheus checkpoint instead of the generated one")
    o.add_argument("--snac-weights", type=Path, help="SNAC checkpoint dir (default WEIGHTS/snac)")
    o.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Poisson arrival rate in requests/s (default 10: faster than any system here serves, so throughput is capacity, not arrivals)",
    )
    o.add_argument("--seed", type=int, default=0, help="workload seed")
    o.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of ours and of the static baseline per level, in turn; figures are each system's "
        "median run (default 3, 1 with --quick)",
    )
    o.add_argument(
        "--placement",
        type=Path,
        help="also serve ours with this placement (e.g. config/placement/orpheus-two-ranks.yaml: LLM and "
        "SNAC in two Worker processes); the headline ratios are then this configuration's",
    )
    o.add_argument(
        "--device",
        default="cpu",
        help="torch device for both systems (default cpu; cuda: the GPU paths, FlashInfer when installed)",
    )
    add_dtype_argument(
        o, what="our compute dtype (transformers runs the faster of float32 and bfloat16, timed in the same run)"
    )
    o.add_argument("--quick", action="store_true", help="a small run for smoke tests")
    o.set_defaults(run=_run_orpheus)


def _run_orpheus(args: argparse.Namespace) -> int:
    from mstar_ros.bench.orpheus import run_orpheus_bench

    return run_orpheus_bench(args)


def bench_subparsers(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The sub-commands of ``bench`` (after ``add_parser``), for other benchmarks to join."""
    bench = sub.choices["bench"]
    return next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))


def positive_ints(text: str) -> list[int]:
    """``--peers 1,2,4,8``-style arguments."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values
