"""``mstar-ros bench rollout``: V-JEPA 2-AC rollouts and CEM plans from a bag, persistent KV vs native recompute."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers, positive_ints, write_report
from mstar_ros.dtype_option import add_dtype_argument

DEFAULT_BAG = Path("out/world_model_synthetic")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = bench_subparsers(sub).add_parser(
        "rollout",
        help="V-JEPA 2-AC rollouts and plans from a bag: persistent KV vs Meta's native recompute",
        description="Drives V-JEPA 2-AC straight from a rosbag2 (no ROS install): frames at --fps, end-effector "
        "poses and gripper, actions from consecutive poses. For each horizon H, a rollout of the bag's "
        "recorded actions from a session whose context is already computed (ours: only the H new "
        "frames run, over the cached K/V) against Meta's native rollout (the whole context re-run "
        "every step); same outputs, interleaved runs, medians. Prints the speedup, the token-count bound "
        "computed in the same run and the goals; then CEM planning time per action at --plan-sessions "
        "robots (ours batches them; Meta's planner serves one robot at a time). Writes JSON and a PNG.",
    )
    p.add_argument(
        "--bag",
        type=Path,
        default=None,
        help=f"a world-model bag (NS/camera/exterior/image_raw, NS/ee_pose, NS/gripper/joint_states); "
        f"default: the synthetic one, written to {DEFAULT_BAG} on first use",
    )
    p.add_argument("--horizons", type=positive_ints, default=[4, 15, 30], help="rollout horizons (default 4,15,30)")
    p.add_argument("--context", type=int, default=1, help="context frames before the start frame (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each system per case (default 3)")
    p.add_argument("--preset", default="bench", choices=["tiny", "bench"], help="generated checkpoint (default bench)")
    p.add_argument("--weights", type=Path, help="Meta's vjepa2-ac-vitg.pt (or a checkpoint directory) instead")
    p.add_argument(
        "--fps", type=float, default=4.0, help="frames per second taken from the bag (default 4, as training)"
    )
    p.add_argument("--plan-sessions", type=positive_ints, default=[1, 4], help="robots planning at once (default 1,4)")
    p.add_argument("--plan-samples", type=int, default=32, help="CEM samples per iteration (default 32; Meta 400)")
    p.add_argument("--plan-iterations", type=int, default=3, help="CEM iterations (default 3; Meta 10)")
    p.add_argument("--plan-horizon", type=int, default=2, help="planned actions (default 2, Meta's wrapper)")
    add_dtype_argument(p, what="compute dtype of both systems (they run the same modules)")
    p.add_argument("--json", type=Path, default=Path("bench-rollout.json"), help="where to write the figures")
    p.add_argument("--plot", type=Path, default=Path("bench-rollout.png"), help="where to write the plot")
    p.add_argument("--quick", action="store_true", help="a small run for smoke tests (tiny preset, H 2,4, 1 repeat)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mstar_ros.bench.rollout import RolloutBenchOptions, run_rollout_bench, summary_lines
    from mstar_ros.bench.rollout_plot import plot_rollout

    if (
        args.context < 0
        or args.repeats < 1
        or args.plan_samples < 2
        or args.plan_iterations < 1
        or args.plan_horizon < 1
    ):
        raise ValueError(
            "--context >= 0, --repeats >= 1, --plan-samples >= 2, --plan-iterations >= 1 and "
            "--plan-horizon >= 1 are needed"
        )
    bag = args.bag
    if bag is None:
        bag = DEFAULT_BAG
        if not bag.exists():
            from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag

            print(f"writing the synthetic world-model bag {bag}")
            bag.parent.mkdir(parents=True, exist_ok=True)
            write_end_effector_bag(bag, EndEffectorBagSpec(robots=2, seconds=12.0))
    opts = RolloutBenchOptions(
        bag=bag,
        horizons=args.horizons,
        context=args.context,
        repeats=args.repeats,
        preset=args.preset,
        weights=args.weights,
        fps=args.fps,
        plan_sessions=args.plan_sessions,
        plan_samples=args.plan_samples,
        plan_topk=min(8, args.plan_samples),
        plan_iterations=args.plan_iterations,
        plan_horizon=args.plan_horizon,
        dtype=args.dtype,
    )
    if args.quick:
        opts.preset, opts.horizons, opts.repeats = "tiny", [2, 4], 1
        opts.plan_sessions, opts.plan_samples, opts.plan_topk, opts.plan_iterations = [1, 2], 8, 4, 2
    report = run_rollout_bench(opts)
    write_report(report, summary_lines(report), args.json, plot_rollout, args.plot)
    return 0
