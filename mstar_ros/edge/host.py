"""One process of the edge box: every front-end of one process group of the edge config, on one asyncio loop.

    mstar_edge_host --config config/edge.yaml --process box [--dtype D] [--duration S]
                    [--summary-json F] [--status-every S] [--ros-args ...]

(also ``python -m mstar_ros.edge.host``; ``mstar-ros launch edge`` and ``ros2 launch mstar_ros
edge.launch.py`` start one per process group, from mstar_ros.edge.launch_spec.) The group's pi0.5
robots (rclpy node set, its Conductor) and its gateway (aiohttp: the voice model's Conductor, the
image model's) all live here, so every engine of every Conductor steps on this process's one device
thread (mstar.engine.device_loop), the most urgent request class first. The group's ``threads`` are
this process's intra-op threads and its ``scheduling`` its CPU policy (mstar_ros.edge.os_scheduling), both
set before torch is imported. At exit it prints what pi0.5 served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time

from mstar_ros.dtype_option import add_dtype_argument  # no torch import either
from mstar_ros.edge.config import EdgeFile, load_edge_config
from mstar_ros.edge.engine_settings import check_engine_configs
from mstar_ros.edge.os_scheduling import apply_scheduling, current_scheduling
from mstar_ros.ros.common.ros_process import split_ros_args  # stdlib only

PROGRAM = "mstar_edge_host"
log = logging.getLogger("mstar_ros.edge")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, ros_args = split_ros_args(argv)
    parser = argparse.ArgumentParser(
        prog=PROGRAM, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="the edge config (config/edge.yaml's format)")
    parser.add_argument("--process", required=True, help="which of its process groups this process runs")
    add_dtype_argument(parser)
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: until stopped)")
    parser.add_argument("--summary-json", help="also write the summary as JSON to this file")
    parser.add_argument(
        "--status-every", type=float, default=0.0, metavar="S", help="print pi0.5's status every S seconds (0: never)"
    )
    return parser.parse_args(argv), ros_args


def set_intra_op_threads(threads: int) -> None:
    """The group's threads for this process's one OpenMP team: before torch is imported (the device
    thread claims torch's default width when it starts)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(threads)


async def serve(args: argparse.Namespace, ros_args: list[str], edge: EdgeFile) -> dict:
    from mstar_ros.edge.gateway_front import start_gateway
    from mstar_ros.edge.pi05_front import pi05_ros_arguments, start_pi05
    from mstar_ros.ros.pi05.node_set import summarize

    group = edge.config.process(args.process)
    dtype = None if args.dtype == "auto" else args.dtype
    nodes, lines, pi05_dtype = [], [], ""
    async with contextlib.AsyncExitStack() as stack:
        if group.pi05 is not None:
            from mstar_ros.ros.common.ros_process import RosProcess

            ros = await stack.enter_async_context(RosProcess(PROGRAM, pi05_ros_arguments(group.pi05, edge, ros_args)))
            policy, conductor, nodes = await start_pi05(stack, group.pi05, edge, dtype, ros)
            stack.callback(_closing, nodes)  # runs before the Conductor closes: chunks in flight end quietly
            ros.spin()
            weights = "RANDOM tiny weights" if policy.random_weights else policy.path
            names = ", ".join(n.get_fully_qualified_name() for n in nodes)
            pi05_dtype = conductor.dtype_summary()
            lines.append(f"  pi0.5 ({weights}) for {names}; dtype {pi05_dtype}")
        if group.gateway is not None:
            served = await start_gateway(stack, group.gateway, edge, dtype)
            lines.append(f"  gateway {served.url}: {', '.join(served.routes)}")
            for role, conductor in served.conductors.items():
                lines.append(f"    {role}: dtype {conductor.dtype_summary()}")
        from mstar.engine.intra_op import model_threads

        print(
            f"edge process {group.name!r} serving {', '.join(group.front_ends())} on one device thread "
            f"({model_threads()} intra-op threads, CPU scheduling {current_scheduling()}; classes control > "
            "interactive > batch)\n" + "\n".join(lines),
            flush=True,
        )
        started = time.monotonic()
        await _until_stopped(args.duration, args.status_every, nodes, started)
        summary = summarize(nodes, time.monotonic() - started) if nodes else {"seconds": time.monotonic() - started}
        summary["process"], summary["dtype"] = group.name, pi05_dtype
    return summary


def _closing(nodes) -> None:
    for node in nodes:
        node.closing = True


async def _until_stopped(duration: float, status_every: float, nodes, started: float) -> None:
    """Until SIGINT / SIGTERM or ``duration`` seconds; pi0.5's status every ``status_every`` seconds."""
    from mstar_ros.ros.pi05.node_set import summarize

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)  # after rclpy's: this process stops as a whole
    while not stop.is_set():
        left = duration - (time.monotonic() - started) if duration else 3600.0
        if left <= 0:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), min(left, status_every or left))
        if status_every and nodes and not stop.is_set():
            s = summarize(nodes, time.monotonic() - started)
            print(
                f"status after {s['seconds']:.0f} s: "
                + "; ".join(
                    f"{ns} {r['chunks']} chunks (p50 {r['latency_p50_ms']} ms)" for ns, r in s["robots"].items()
                ),
                flush=True,
            )


def print_summary(summary: dict) -> None:
    if "robots" in summary:
        from mstar_ros.ros.pi05.node_set import print_summary as print_pi05

        print_pi05(summary)
    print(f"edge process {summary['process']!r} stopped after {summary['seconds']:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.bag.ros_env import apply_localhost_defaults
    from mstar_ros.omp_defaults import apply_spin_default
    from mstar_ros.ros.common.ros_process import run_serving

    apply_localhost_defaults()
    apply_spin_default()  # before torch is imported: see mstar_ros.omp_defaults
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    args, ros_args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        edge = load_edge_config(args.config)
        group = edge.config.process(args.process)
    except ValueError as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return 2
    try:
        apply_scheduling(group.scheduling)  # before torch: its threads inherit the policy
    except OSError as exc:
        print(f"{PROGRAM}: error: process {group.name!r}: {exc}", file=sys.stderr)
        return 2
    set_intra_op_threads(group.threads)
    try:
        check_engine_configs(edge)  # after the threads are set: it may import torch
    except ValueError as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return 2
    status, summary = run_serving(PROGRAM, serve(args, ros_args, edge), args.summary_json)
    if summary is not None:
        print_summary(summary)
    return status


if __name__ == "__main__":
    sys.exit(main())
