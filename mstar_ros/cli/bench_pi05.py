"""``mstar-ros bench pi05``: N robots on one Conductor vs the pi0.5 model called once per observation."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``pi05`` under the ``bench`` command (call after mstar_ros.cli.bench.add_parser)."""
    p = bench_subparsers(sub).add_parser(
        "pi05",
        help="pi0.5 policy serving for N robots vs the model called directly, one observation per call",
        description="pi0.5 serving N robots from one embedded Conductor (in process: no ROS transport in the "
        "timed path) against today's policy-server pattern measured in the same run: the model "
        "called directly (graphs/pi05/direct.py), one observation per call, robots served one after "
        "another, no batching. Same checkpoint, dtype (--dtype; both dtypes are timed and reported beside it), "
        "observations (from the synthetic DROID-like bag) and flow noise. Per robot count: "
        "aggregate chunks/s in a closed loop and sensor-to-action latency p50/p95 with observations "
        "offered at --hz per robot (a robot acts on its newest observation, waiting for the next one "
        "when the newest is past half a period, as the policy node does: --frame-policy; when a "
        "system is overloaded, superseded observations are dropped and counted). Writes every figure to JSON "
        "and a PNG plot. On 2 CPU cores the bench preset takes about 0.4-0.5 s per chunk and the "
        "default run about 5 minutes (4 measurements of --seconds per robot count).",
    )
    p.add_argument("--robots", default="1,2,4,8", help="comma-separated robot counts (default 1,2,4,8)")
    p.add_argument(
        "--json",
        type=Path,
        help="where to write the figures (default bench-pi05.json; with --flood bench-pi05-flood.json)",
    )
    p.add_argument("--plot", type=Path, default=Path("bench-pi05.png"), help="where to write the plot")
    p.add_argument(
        "--preset", default="bench", choices=["tiny", "bench"], help="generated checkpoint preset (default bench)"
    )
    p.add_argument(
        "--weights", type=Path, help="a real pi0.5 PyTorch checkpoint directory instead of the generated one"
    )
    p.add_argument("--seconds", type=float, default=15.0, help="seconds per measurement (default 15)")
    p.add_argument(
        "--hz", type=float, default=10.0, help="observations per second per robot in the open loop (default 10)"
    )
    p.add_argument("--seed", type=int, default=0, help="synthetic bag seed")
    p.add_argument(
        "--frame-policy",
        choices=["fresh", "newest"],
        default="fresh",
        help="open loop, both systems: 'fresh' (default; the policy node's wait_for_fresh_frames) "
        "waits for the next observation when the newest is past half a period old; 'newest' "
        "acts on the newest whatever its age",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=0,
        metavar="K",
        help="ours: at most K robots' chunks in flight, each robot taking its observation when admitted "
        "(the node set's --max-inflight; 0, the default: no limit): less sensor-to-action latency "
        "under load, fewer robots batched",
    )
    p.add_argument(
        "--flood",
        action="store_true",
        help="instead: does a flood of bad frames on one robot slow another? The pi0.5 node set over "
        "real DDS serving two robots from the synthetic bag, with robot 2's camera flooded with "
        "malformed frames in ABBA windows of --seconds; prints robot 1's latency p50/p95 with and "
        "without the flood and their ratios (mstar_ros/bench/pi05_flood.py)",
    )
    p.add_argument("--flood-rate", type=float, default=400.0, help="--flood: bad frames per second (default 400)")
    p.add_argument(
        "--flood-warmup", type=float, default=8.0, help="--flood: seconds served before the first window (default 8)"
    )
    add_dtype_argument(p, what="compute dtype of both systems (they run the same modules)")
    p.add_argument(
        "--device",
        default="cpu",
        help="torch device for both systems (default cpu; cuda: the GPU paths, FlashInfer when installed)",
    )
    p.set_defaults(run=_run_pi05)


def _run_pi05(args: argparse.Namespace) -> int:
    if not (args.seconds > 0 and args.hz > 0):
        raise ValueError("--seconds and --hz must be positive")
    if args.max_inflight < 0:
        raise ValueError(f"--max-inflight must be >= 0 (0: no limit), got {args.max_inflight}")
    if args.flood:
        if not (args.flood_rate > 0 and args.flood_warmup >= 0):
            raise ValueError("--flood-rate must be > 0 and --flood-warmup >= 0")
        from mstar_ros.bench.pi05_flood import main_flood

        return main_flood(args)
    args.json = args.json or Path("bench-pi05.json")
    from mstar_ros.bench.pi05 import run_pi05_bench

    return run_pi05_bench(args)
