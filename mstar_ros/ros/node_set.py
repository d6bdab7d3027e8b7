"""The pi0.5 node set in one process: the Conductor's node plus one policy node per robot.

    python -m mstar_ros.ros.node_set --robots /robot1 /robot2 [--weights DIR] [--placement FILE]
                                     [--duration S] [--ros-args -r ... -p ... --params-file F]

The Conductor (its Workers in this process, or in Worker processes per --placement)
serves every robot's requests, batched together. ``/mstar/conductor`` publishes the
runtime's state on /diagnostics once a second. rclpy runs in its own thread; the
Conductor runs on this process's asyncio loop. At exit (after --duration, Ctrl-C or
SIGTERM) it prints what it served: chunks per second and sensor-to-action latency
per robot, and the joint names it commanded.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
import time

log = logging.getLogger("mstar_ros.node_set")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ros_args: list[str] = []
    if "--ros-args" in argv:
        cut = argv.index("--ros-args")
        argv, ros_args = argv[:cut], argv[cut:]
    parser = argparse.ArgumentParser(prog="mstar_ros.ros.node_set", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--robots", nargs="+", default=["/robot1"], help="robot namespaces (default /robot1)")
    parser.add_argument("--weights", help="pi0.5 PyTorch checkpoint dir (default: generated tiny, RANDOM weights)")
    parser.add_argument("--preset", default="tiny", help="generated checkpoint preset when --weights is not given")
    parser.add_argument("--placement", help="placement YAML: Workers in their own processes")
    parser.add_argument("--rate", type=float, help="control rate in Hz for every robot (overrides the parameter)")
    parser.add_argument("--prompt", help="task prompt for every robot (overrides the parameter)")
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: until stopped)")
    parser.add_argument("--summary-json", help="also write the summary as JSON to this file")
    return parser.parse_args(argv), ros_args


def summarize(nodes, elapsed: float) -> dict:
    out = {"seconds": round(elapsed, 2), "robots": {}}
    for node in nodes:
        lat = sorted(node.stats.latencies_s)
        pct = (lambda q: round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 1)) if lat else (lambda q: None)
        out["robots"][node.get_namespace()] = {
            "chunks": node.stats.chunks, "chunks_per_s": round(node.stats.chunks / elapsed, 2) if elapsed else 0.0,
            "latency_p50_ms": pct(0.5), "latency_p95_ms": pct(0.95), "dropped_frames": node.stats.dropped,
            "last_error": node.stats.last_error, "joint_names": node.joint_names,
            "horizon": node.chunker.horizon, "rate_hz": node.rate}
    total = sum(r["chunks"] for r in out["robots"].values())
    out["chunks_per_s"] = round(total / elapsed, 2) if elapsed else 0.0
    return out


def conductor_node(conductor):
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rclpy.node import Node

    class ConductorNode(Node):
        def __init__(self) -> None:
            super().__init__("conductor", namespace="/mstar")
            self.pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.create_timer(1.0, self._publish)

        def _publish(self) -> None:
            stats = conductor.stats()
            values = [KeyValue(key="in_flight", value=str(stats["in_flight"])),
                      KeyValue(key="kv_blocks_used", value=str(conductor.kv_blocks_used()))]
            for i, worker in enumerate(stats["workers"]):
                for engine, counters in worker.items():
                    values += [KeyValue(key=f"worker{i}.{engine}.{k}", value=str(v)) for k, v in counters.items()]
            status = DiagnosticStatus(level=DiagnosticStatus.OK, name="mstar: conductor", message="serving",
                                      hardware_id="mstar", values=values)
            array = DiagnosticArray(status=[status])
            array.header.stamp = self.get_clock().now().to_msg()
            self.pub.publish(array)

    return ConductorNode()


async def serve(args: argparse.Namespace, ros_args: list[str]) -> dict:
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    from mstar.conductor import Conductor
    from mstar_graphs.pi05.policy import Pi05Policy
    from mstar_ros.ros.policy_node import make_policy_node

    policy = Pi05Policy.load(args.weights, preset=args.preset)
    if args.placement:
        raise SystemExit("--placement for pi0.5 needs its Worker-process factory (not yet available)")
    conductor = Conductor(policy.graph(), policy.modules())
    rclpy.init(args=["mstar_pi05"] + ros_args)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with conductor:
        overrides = {k: v for k, v in (("control_rate_hz", args.rate), ("prompt", args.prompt)) if v is not None}
        nodes = [make_policy_node(policy, conductor, loop, ns, overrides) for ns in args.robots]
        executor = MultiThreadedExecutor(num_threads=2)
        for node in nodes + [conductor_node(conductor)]:
            executor.add_node(node)
        spinner = threading.Thread(target=executor.spin, name="rclpy", daemon=True)
        spinner.start()
        names = ", ".join(n.get_fully_qualified_name() for n in nodes)
        print(f"serving pi0.5 ({'RANDOM tiny weights' if policy.random_weights else policy.path}) for {names}",
              flush=True)
        started = time.monotonic()
        try:
            await asyncio.wait_for(stop.wait(), args.duration) if args.duration else await stop.wait()
        except asyncio.TimeoutError:
            pass
        summary = summarize(nodes, time.monotonic() - started)
        executor.shutdown()
        for node in executor.get_nodes():
            node.destroy_node()
    rclpy.try_shutdown()
    return summary


def print_summary(summary: dict) -> None:
    print(f"served {summary['chunks_per_s']} chunks/s over {summary['seconds']} s")
    for ns, r in summary["robots"].items():
        print(f"  {ns}: {r['chunks']} chunks ({r['chunks_per_s']}/s), sensor-to-action p50 {r['latency_p50_ms']} ms, "
              f"p95 {r['latency_p95_ms']} ms, {r['horizon']} actions @ {r['rate_hz']} Hz, "
              f"{r['dropped_frames']} frames dropped; joints {', '.join(r['joint_names'])}")
        if r["last_error"]:
            print(f"    last problem: {r['last_error']}")


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.bag.ros_env import apply_localhost_defaults

    apply_localhost_defaults()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    args, ros_args = parse_args(sys.argv[1:] if argv is None else argv)
    summary = asyncio.run(serve(args, ros_args))
    print_summary(summary)
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
