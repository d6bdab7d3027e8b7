"""The pi0.5 node set in one process: the Conductor's node plus one policy node per robot.

    mstar_pi05_node_set --robots /robot1 /robot2 [--weights DIR] [--placement FILE]
                        [--duration S] [--ros-args -r ... -p ... --params-file F]

(also ``python -m mstar_ros.ros.pi05.node_set``; ``mstar-ros launch pi05`` and
``ros2 launch mstar_ros pi05.launch.py`` start it from mstar_ros.launch_spec.)
The Conductor (its Workers in this process, or in Worker processes per --placement)
serves every robot's requests, batched together. ``/mstar/conductor`` publishes the
runtime's state on /diagnostics once a second. rclpy runs in its own thread; the
Conductor runs on this process's asyncio loop. At exit (after --duration, Ctrl-C or
SIGTERM) it prints what it served: chunks per second and sensor-to-action latency
per robot, and the joint names it commanded (or the action names and space).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

from mstar_ros.dtype_option import add_dtype_argument  # no torch import either
from mstar_ros.ros.common.ros_process import split_ros_args  # stdlib only: torch is not imported yet

log = logging.getLogger("mstar_ros.node_set")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, ros_args = split_ros_args(argv)
    parser = argparse.ArgumentParser(
        prog="mstar_pi05_node_set", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--robots", nargs="+", default=["/robot1"], help="robot namespaces (default /robot1)")
    parser.add_argument("--weights", help="pi0.5 PyTorch checkpoint dir (default: generated tiny, RANDOM weights)")
    parser.add_argument("--preset", default="tiny", help="generated checkpoint preset when --weights is not given")
    parser.add_argument(
        "--tokenizer",
        help="PaliGemma tokenizer file or directory (tokenizer.model, "
        "paligemma_tokenizer.model or tokenizer.json; default: looked for in "
        "the checkpoint, then in openpi's download cache)",
    )
    parser.add_argument(
        "--asset-id",
        help="openpi checkpoints: which assets/<asset_id>/norm_stats.json to use (needed when there are several)",
    )
    parser.add_argument("--placement", help="placement YAML: Workers in their own processes")
    add_dtype_argument(parser)
    parser.add_argument("--rate", type=float, help="control rate in Hz for every robot (wins over the params file)")
    parser.add_argument("--prompt", help="task prompt for every robot (wins over the params file)")
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=0,
        metavar="K",
        help="at most K robots' chunks in flight at once (0, the default: no limit); a robot takes "
        "its observation when admitted, so K bounds sensor-to-action latency under load, at "
        "the price of batching fewer robots together",
    )
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: until stopped)")
    parser.add_argument("--summary-json", help="also write the summary as JSON to this file")
    parser.add_argument(
        "--status-every",
        type=float,
        default=0.0,
        metavar="S",
        help="print a status line (chunks, latency per robot) every S seconds (0: never)",
    )
    args = parser.parse_args(argv)
    if args.max_inflight < 0:
        parser.error(f"--max-inflight must be >= 0 (0: no limit), got {args.max_inflight}")
    # as ROS parameters after everything else: a params file would win over a declared default
    if args.rate is not None:
        ros_args += ["--ros-args", "-p", f"control_rate_hz:={float(args.rate)!r}"]
    if args.prompt is not None:
        ros_args += ["--ros-args", "-p", f"prompt:={json.dumps(args.prompt)}"]  # quoted: 'yes' stays a string
    return args, ros_args


def summarize(nodes, elapsed: float) -> dict:
    """Per robot: chunks per second since its first request (when its data started flowing)."""
    admission = nodes[0].admission if nodes else None
    out = {
        "seconds": round(elapsed, 2),
        "max_inflight": admission.limit if admission else 0,
        "peak_in_flight": admission.peak_in_flight if admission else 0,
        "robots": {},
    }
    end = time.monotonic()
    for node in nodes:
        s = node.stats
        lat = sorted(s.latencies_s)
        pct = (
            (lambda q, lat=lat: round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 1)) if lat else (lambda q: None)
        )
        served = end - s.first_request if s.first_request is not None else 0.0
        out["robots"][node.get_namespace()] = {
            "chunks": s.chunks,
            "serving_s": round(served, 2),
            "chunks_per_s": round(s.chunks / served, 2) if served > 0 else 0.0,
            "latency_p50_ms": pct(0.5),
            "latency_p95_ms": pct(0.95),
            "latencies_ms": [round(1000 * x, 1) for x in s.latencies_s],
            "chunk_times_s": [round(t, 4) for t in s.published_at],  # time.monotonic() (one clock per host)
            "dropped_frames": s.dropped,
            "stale_frames": s.stale_frames,
            "chunks_failed": s.chunks_failed,
            "chunks_discarded": s.chunks_discarded,
            "prompts_refused": s.prompts_refused,
            "sensor_losses": s.sensor_losses,
            "policy_outages": s.policy_outages,
            "chunks_overdue": s.chunks_overdue,
            "stops_published": s.stops_published,
            "topics_shut": s.topics_shut,
            "states_outside_limits": s.states_outside_limits,
            "chunks_outside_limits": s.chunks_outside_limits,
            "fresh_waits": s.fresh_waits,
            "admission_waits": s.admission_waits,
            "last_error": s.last_error,
            "joint_names": node.joint_names,
            "action_names": node.action_names,
            "action_space": node.output.space,
            "horizon": node.chunker.horizon,
            "refill_at": node.chunker.refill_at,
            "rate_hz": node.rate,
            "prompt": node.prompt,
            "normalisation": node.normalization.describe(),
        }
    out["chunks_per_s"] = round(sum(r["chunks_per_s"] for r in out["robots"].values()), 2)
    return out


async def serve(args: argparse.Namespace, ros_args: list[str]) -> dict:
    from mstar.conductor import Conductor
    from mstar.engine.config import EngineConfig
    from mstar_graphs.pi05.frontend import Pi05Policy
    from mstar_ros.policy.admission import ChunkAdmission
    from mstar_ros.ros.common.conductor_node import ConductorNode
    from mstar_ros.ros.common.ros_process import RosProcess
    from mstar_ros.ros.pi05.policy_node import PolicyNode

    # requests are built here (tokenizer, shapes); with a placement the weights live in the Workers only
    policy = Pi05Policy.load(
        args.weights,
        preset=args.preset,
        tokenizer=args.tokenizer,
        asset_id=args.asset_id,
        load_weights=not args.placement,
    )
    if args.placement:
        from mstar_graphs.pi05.components import pi05_spec
        from mstar_ros.ros.common.worker_diagnostics import PLUGIN

        conductor = Conductor.distributed(
            pi05_spec(args.weights, preset=args.preset),
            args.placement,
            config=EngineConfig(dtype=args.dtype),
            plugins=(PLUGIN,),
        )  # each Worker process reports on /diagnostics
    else:
        conductor = Conductor(policy.graph(), policy.modules(), config=EngineConfig(dtype=args.dtype))
    async with RosProcess("mstar_pi05_node_set", ros_args) as ros:
        async with conductor:
            admission = ChunkAdmission(args.max_inflight)
            nodes = [
                PolicyNode(policy, conductor, asyncio.get_running_loop(), ns, admission=admission) for ns in args.robots
            ]
            ros.add(*nodes, ConductorNode(conductor))
            ros.spin()
            names = ", ".join(n.get_fully_qualified_name() for n in nodes)
            print(
                f"serving pi0.5 ({'RANDOM tiny weights' if policy.random_weights else policy.path}) for {names}",
                flush=True,
            )
            print(f"  dtype {conductor.dtype_summary()}", flush=True)
            started = time.monotonic()
            await _run_until_stopped(ros.stop, nodes, started, args.duration, args.status_every)
            summary = summarize(nodes, time.monotonic() - started)
            summary["dtype"] = conductor.dtype_summary()
            for node in nodes:
                node.closing = True  # chunks still in flight are cancelled quietly
    return summary


async def _run_until_stopped(stop: asyncio.Event, nodes, started: float, duration: float, status_every: float):
    while not stop.is_set():
        left = duration - (time.monotonic() - started) if duration else float("inf")
        if left <= 0:
            return
        try:
            await asyncio.wait_for(stop.wait(), min(left, status_every or left, 3600.0))
        except asyncio.TimeoutError:
            if status_every and not (duration and time.monotonic() - started >= duration):
                s = summarize(nodes, time.monotonic() - started)
                print(
                    f"status after {s['seconds']:.0f} s: "
                    + "; ".join(
                        f"{ns} {r['chunks']} chunks ({r['chunks_per_s']}/s, p50 {r['latency_p50_ms']} ms)"
                        for ns, r in s["robots"].items()
                    ),
                    flush=True,
                )


def print_summary(summary: dict) -> None:
    print(f"served {summary['chunks_per_s']} chunks/s in all over {summary['seconds']} s, dtype {summary['dtype']}")
    for ns, r in summary["robots"].items():
        print(
            f"  {ns}: {r['chunks']} chunks ({r['chunks_per_s']}/s), sensor-to-action p50 {r['latency_p50_ms']} ms, "
            f"p95 {r['latency_p95_ms']} ms, {r['horizon']} actions @ {r['rate_hz']} Hz; "
            f"{r['dropped_frames']} bad messages dropped, {r['stale_frames']} stale frames not acted on, "
            f"{r['chunks_failed']} chunks failed, {r['prompts_refused']} prompts refused, "
            f"{r['sensor_losses']} sensor losses, {r['policy_outages']} policy outages; {r['fresh_waits']} waited "
            f"for a fresher frame, {r['admission_waits']} for an in-flight slot; joints {', '.join(r['joint_names'])}"
            + (
                ""
                if r["action_names"] == r["joint_names"] and r["action_space"] == "joint_positions"
                else f"; actions ({r['action_space']}) {', '.join(r['action_names'])}"
            )
        )
        if r["last_error"]:
            print(f"    last problem: {r['last_error']}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.ros.common.ros_process import node_process_main

    return node_process_main(
        "mstar_pi05_node_set", sys.argv[1:] if argv is None else argv, parse_args, serve, print_summary
    )


if __name__ == "__main__":
    sys.exit(main())
