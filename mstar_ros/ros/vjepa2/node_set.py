"""The V-JEPA 2-AC node set in one process: the Conductor's node plus one world-model node per robot.

    mstar_vjepa2_node_set --robots /robot1 /robot2 [--weights PATH] [--duration S]
                          [--ros-args -r ... -p ... --params-file F]

(also ``mstar-ros launch vjepa2`` and ``ros2 launch mstar_ros vjepa2.launch.py``). Every robot's
frames extend its own session; rollouts and plans of all robots batch together in the runtime.
At exit it prints per robot the frames taken, plans made, plan latency and what was dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time

from mstar_ros.dtype_option import add_dtype_argument
from mstar_ros.ros.common.ros_process import split_ros_args

log = logging.getLogger("mstar_ros.vjepa2_node_set")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, ros_args = split_ros_args(argv)
    parser = argparse.ArgumentParser(
        prog="mstar_vjepa2_node_set", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--robots", nargs="+", default=["/robot1"], help="robot namespaces (default /robot1)")
    parser.add_argument(
        "--weights", help="Meta's vjepa2-ac-vitg.pt or a checkpoint directory (default: generated tiny, RANDOM weights)"
    )
    parser.add_argument("--preset", default="tiny", help="generated checkpoint preset when --weights is not given")
    add_dtype_argument(parser)
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: until stopped)")
    parser.add_argument("--summary-json", help="also write the summary as JSON to this file")
    return parser.parse_args(argv), ros_args


def summarize(nodes, elapsed: float) -> dict:
    robots = {}
    for node in nodes:
        s = node.stats
        lat = sorted(s.plan_latencies_s)
        robots[node.get_namespace()] = {
            "frames": s.frames,
            "frames_skipped": s.frames_skipped,
            "plans": s.plans,
            "goals": s.goals,
            "dropped": s.dropped,
            "dropped_by_topic": dict(s.dropped_by_topic),
            "stamps_refused": s.stamps_refused,
            "topics_shut": s.topics_shut,
            "last_plan_seed": s.last_plan_seed,
            "frames_failed": s.frames_failed,
            "plans_failed": s.plans_failed,
            "last_energy": s.last_energy,
            "plan_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
            "window_frames": node.window,
            "last_error": s.last_error,
            "plan_times_s": [round(t, 4) for t in s.plan_times_s],
        }  # monotonic: one clock for this host's processes
    return {"seconds": round(elapsed, 2), "robots": robots}


def pool_config(nodes, predictor, dtype: str = "auto"):
    """KV pool for every robot's window plus one plan's samples x horizon (a frame per block):
    the default pool would hold 5 frames of the released model in fp32 (48 MiB each)."""
    from mstar.engine.config import EngineConfig
    from mstar.engine.dtype_choice import resolve_dtype

    blocks = sum(node.kv_frames_needed for node in nodes) + 4
    most_samples = max(node.cem.samples for node in nodes)
    choice = resolve_dtype(dtype, "cpu")  # the Worker decides the same (once per process); its reason is reported
    per_block = predictor.kv_spec().bytes_per_token(choice.torch_dtype) * predictor.frame_tokens
    log.info(
        "KV pool: %d frame blocks, %.0f MiB in %s (per robot: its window + plan samples x horizon)",
        blocks,
        blocks * per_block / 2**20,
        choice.dtype,
    )
    return EngineConfig(
        num_kv_blocks=blocks, dtype=dtype, max_batched_tokens=max(1024, most_samples * predictor.frame_tokens)
    )


async def serve(args: argparse.Namespace, ros_args: list[str]) -> dict:
    from mstar.conductor import Conductor
    from mstar_graphs.vjepa2.components import vjepa2_components
    from mstar_graphs.vjepa2.graph import vjepa2_graph
    from mstar_ros.ros.common.conductor_node import ConductorNode
    from mstar_ros.ros.common.ros_process import RosProcess
    from mstar_ros.ros.vjepa2.world_model_node import WorldModelNode

    graph, modules = vjepa2_components({n.name for n in vjepa2_graph().nodes}, args.weights, args.preset, progress=True)
    predictor = modules["predictor"]
    async with RosProcess("mstar_vjepa2_node_set", ros_args) as ros:
        loop = asyncio.get_running_loop()
        nodes = [WorldModelNode(loop, ns, predictor.max_frames) for ns in args.robots]
        config = pool_config(nodes, predictor, args.dtype)
        async with Conductor(graph, modules, config=config) as conductor:
            for node in nodes:
                node.conductor = conductor
            ros.add(*nodes, ConductorNode(conductor))
            ros.spin()
            what = "RANDOM tiny weights" if args.weights is None else args.weights
            print(
                f"serving V-JEPA 2-AC ({what}) for {', '.join(n.get_fully_qualified_name() for n in nodes)}", flush=True
            )
            print(f"  dtype {conductor.dtype_summary()}", flush=True)
            started = time.monotonic()
            await ros.stopped(args.duration)
            summary = summarize(nodes, time.monotonic() - started)
            summary["dtype"] = conductor.dtype_summary()
            for node in nodes:
                node.close()
    return summary


def print_summary(summary: dict) -> None:
    print(f"served {len(summary['robots'])} robot(s) for {summary['seconds']} s, dtype {summary.get('dtype', '?')}")
    for ns, r in summary["robots"].items():
        print(
            f"  {ns}: {r['frames']} frames ({r['frames_skipped']} skipped: the model was busy), {r['plans']} plans (p50 {r['plan_p50_ms']} ms), best energy "
            f"{r['last_energy']}, {r['dropped']} bad messages dropped, {r['frames_failed']} frames and "
            f"{r['plans_failed']} plans failed, window {r['window_frames']} frames"
        )
        if r["dropped_by_topic"]:
            print(
                f"    dropped by topic: {', '.join(f'{t} {n}' for t, n in sorted(r['dropped_by_topic'].items()))} "
                f"({r['stamps_refused']} for their stamps); topics shut for flooding: {r['topics_shut']}"
            )
        if r["last_error"]:
            print(f"    last problem: {r['last_error']}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.ros.common.ros_process import node_process_main

    return node_process_main(
        "mstar_vjepa2_node_set", sys.argv[1:] if argv is None else argv, parse_args, serve, print_summary
    )


if __name__ == "__main__":
    sys.exit(main())
