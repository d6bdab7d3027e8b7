"""The BAGEL node set in one process: the Conductor's node plus one BAGEL node per namespace.

    mstar_bagel_node_set --robots /robot1 [--weights DIR] [--placement FILE] [--duration S]
                         [--ros-args -r ... -p ... --params-file F]

(also ``python -m mstar_ros.ros.bagel.node_set``; ``ros2 launch mstar_ros bagel.launch.py`` starts it from
mstar_ros.launch_spec_bagel, and ``bagel_vjepa2.launch.py`` beside the V-JEPA 2-AC node set.) Each
NS/bagel node answers questions about NS/camera/exterior/image_raw on NS/bagel/answer and publishes the
frame edited by an instruction on NS/goal_image (mstar_ros/ros/bagel/bagel_node.py). Without --weights the
model is a generated tiny checkpoint with RANDOM weights (said in the log): its answers and images are noise.
At exit it prints per namespace the frames, answers and goal images it made and what it dropped.
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

log = logging.getLogger("mstar_ros.bagel_node_set")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, ros_args = split_ros_args(argv)
    parser = argparse.ArgumentParser(
        prog="mstar_bagel_node_set", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--robots", nargs="+", default=["/robot1"], help="namespaces, one node each (default /robot1)")
    parser.add_argument("--weights", help="BAGEL-7B-MoT checkpoint directory (default: generated tiny, RANDOM weights)")
    parser.add_argument("--preset", default="tiny", help="generated checkpoint preset when --weights is not given")
    parser.add_argument("--placement", help="placement YAML: the model in Worker processes")
    add_dtype_argument(parser)
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: until stopped)")
    parser.add_argument("--summary-json", help="also write the summary as JSON to this file")
    return parser.parse_args(argv), ros_args


def _p50_ms(values) -> float | None:
    return round(1000 * statistics.median(values), 1) if values else None


def summarize(nodes, elapsed: float) -> dict:
    robots = {}
    for node in nodes:
        s = node.stats
        robots[node.get_namespace()] = {
            "frames": s.frames,
            "questions": s.questions,
            "answers": s.answers,
            "edits": s.edits,
            "goals": s.goals,
            "failed": s.failed,
            "dropped": s.dropped,
            "refused_busy": s.busy,
            "topics_shut": s.topics_shut,
            "dropped_by_topic": dict(s.dropped_by_topic),
            "answer_p50_ms": _p50_ms(s.answer_latencies_s),
            "edit_p50_ms": _p50_ms(s.edit_latencies_s),
            "last_error": s.last_error,
        }
    return {"seconds": round(elapsed, 2), "robots": robots}


def _conductor(model, args: argparse.Namespace):
    from mstar.conductor import Conductor
    from mstar.engine.config import EngineConfig

    config = EngineConfig(dtype=args.dtype)
    if not args.placement:
        return Conductor(model.graph(), model.modules(), config=config)
    from mstar_ros.ros.common.worker_diagnostics import PLUGIN

    # each Worker process reports on /diagnostics
    return Conductor.distributed(model.worker_spec(), args.placement, config=config, plugins=(PLUGIN,))


async def serve(args: argparse.Namespace, ros_args: list[str]) -> dict:
    from mstar_graphs.bagel.frontend import BagelModel
    from mstar_ros.ros.bagel.bagel_node import BagelNode
    from mstar_ros.ros.common.conductor_node import ConductorNode
    from mstar_ros.ros.common.ros_process import RosProcess

    # requests are built here (tokenizer, image transforms); with a placement the weights live in the Workers,
    # and guidance views it puts on different ranks switch guided images to the CFG-parallel flow
    model = BagelModel.load(
        args.weights, preset=args.preset, requests_only=bool(args.placement), placement=args.placement or None
    )
    conductor = _conductor(model, args)
    async with RosProcess("mstar_bagel_node_set", ros_args) as ros:
        async with conductor:
            loop = asyncio.get_running_loop()
            nodes = [BagelNode(model, conductor, loop, ns) for ns in args.robots]
            ros.add(*nodes, ConductorNode(conductor))
            ros.spin()
            what = "RANDOM tiny weights: answers and images are noise" if model.random_weights else str(model.path)
            print(f"serving BAGEL ({what}) for {', '.join(n.get_fully_qualified_name() for n in nodes)}", flush=True)
            print(f"  dtype {conductor.dtype_summary()}", flush=True)
            started = time.monotonic()
            await ros.stopped(args.duration)
            summary = summarize(nodes, time.monotonic() - started)
            summary["dtype"] = conductor.dtype_summary()
            for node in nodes:
                node.close()
    return summary


def print_summary(summary: dict) -> None:
    print(f"served {len(summary['robots'])} namespace(s) for {summary['seconds']} s, dtype {summary.get('dtype', '?')}")
    for ns, r in summary["robots"].items():
        print(
            f"  {ns}: {r['frames']} frames, {r['answers']} answers (p50 {r['answer_p50_ms']} ms), {r['goals']} goal "
            f"images (p50 {r['edit_p50_ms']} ms), {r['failed']} requests failed, {r['dropped']} dropped"
        )
        if r["dropped_by_topic"]:
            print(f"    dropped by topic: {', '.join(f'{t} {n}' for t, n in sorted(r['dropped_by_topic'].items()))}")
        if r["last_error"]:
            print(f"    last problem: {r['last_error']}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.ros.common.ros_process import node_process_main

    return node_process_main(
        "mstar_bagel_node_set", sys.argv[1:] if argv is None else argv, parse_args, serve, print_summary
    )


if __name__ == "__main__":
    sys.exit(main())
