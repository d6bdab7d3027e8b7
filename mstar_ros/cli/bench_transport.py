"""``mstar-ros bench transport``: tensor transports between two processes vs in-process memcpy."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``transport`` under the ``bench`` command (call after mstar_ros.cli.bench.add_parser)."""
    t = bench_subparsers(sub).add_parser(
        "transport",
        help="tensor transports (shm, tcp, mooncake, inline) between two processes vs memcpy",
        description="Latency and bandwidth of moving a tensor between two real processes with each "
        "transport, against in-process memcpy measured in the same run. A peer process echoes "
        "tensors; handles travel over a plain TCP control socket on 127.0.0.1; one-way time is "
        "the round trip / 2 and includes the producer's export and the consumer's read. "
        'Writes every figure to JSON (under the top-level key "transport") and a PNG plot.',
    )
    t.add_argument("--json", type=Path, default=Path("bench-transport.json"), help="where to write the figures")
    t.add_argument("--plot", type=Path, default=Path("bench-transport.png"), help="where to write the plot")
    t.add_argument(
        "--quick",
        action="store_true",
        help="a small run for smoke tests: every transport at 4K and 1M, 3 repeats, 2 tiny Orpheus "
        "requests (options given explicitly still win)",
    )
    t.add_argument(
        "--sizes", default=None, help="comma-separated tensor sizes, with K/M suffixes (binary; default 4K,16K,...,64M)"
    )
    t.add_argument(
        "--transports",
        default="inline,shm,tcp,mooncake",
        help="comma-separated transports (default all; mooncake is skipped with a note when not installed)",
    )
    t.add_argument("--repeats", type=int, default=None, help="timed round trips per transport and size (default 50)")
    t.add_argument(
        "--orpheus-requests",
        type=int,
        default=None,
        help="also serve this many Orpheus requests at concurrency 8 in one process and with LLM and "
        "SNAC in two Worker processes (key orpheus_split); 0 skips it (default 16)",
    )
    t.add_argument(
        "--orpheus-preset",
        default=None,
        choices=["tiny", "bench"],
        help="Orpheus checkpoint for that comparison (default bench)",
    )
    t.set_defaults(run=_run_transport)


def _run_transport(args: argparse.Namespace) -> int:
    from mstar_ros.bench.transport import apply_defaults, run_transport_bench

    apply_defaults(args)
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    return run_transport_bench(args)
