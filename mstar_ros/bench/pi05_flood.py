"""``mstar-ros bench pi05 --flood``: does one robot's flood of bad frames slow another robot's chunks?

One pi0.5 node set serves two robots, both fed by the synthetic bag (``bag play --restamp``),
over real DDS on this host. Time is cut into windows in ABBA order (quiet, flood, flood,
quiet, after a warm-up); in the flood windows this process publishes malformed camera frames
(an unsupported encoding, 224x224) on robot 2's exterior camera at ``rate_hz`` (400 by
default). Robot 1's sensor-to-action latency is taken from the node set's own summary
(each chunk's latency and the monotonic time it was published, one clock for every
process of this host), bucketed by window. The ratio flood / quiet of robot 1's p50 and
p95 is the figure; robot 2's counters show what its node did with the flood: the frames it
received and dropped, how often it cut the topic (max_bad_rate_hz) and the sensor losses
that followed (robot 2 stops while its camera is cut).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mstar_ros.bench.workload import percentile

FLOOD_TOPIC = "/robot2/camera/exterior/image_raw"
ORDER = ("quiet", "flood", "flood", "quiet")


@dataclass(frozen=True)
class FloodOptions:
    seconds: float = 15.0  # per window
    warmup_s: float = 8.0  # after the first chunks, before the first window
    rate_hz: float = 400.0  # bad frames per second in the flood windows
    control_rate_hz: float = 15.0  # the robots' rate (the node set's default)
    weights: str = ""
    preset: str = "tiny"
    dtype: str = "auto"  # the node set's --dtype


class Flooder:
    """An rclpy publisher of malformed frames (rgba8, which no node takes) on ``topic``, at a steady
    rate while ``on`` is set."""

    def __init__(self, rate_hz: float, topic: str = FLOOD_TOPIC) -> None:
        import rclpy
        from rclpy.context import Context
        from sensor_msgs.msg import Image

        self.context = Context()
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node("bench_flooder", context=self.context)
        self.topic = topic
        self.pub = self.node.create_publisher(Image, topic, 10)
        self.frame = Image(encoding="rgba8", width=224, height=224, step=224 * 4)
        self.frame.data = bytes(224 * 224 * 4)
        self.period = 1.0 / rate_hz
        self.on, self.stop = threading.Event(), threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self.stop.is_set():
            if self.on.is_set():
                self.pub.publish(self.frame)
                self.sent += 1
            next_t += self.period
            time.sleep(max(0.0, next_t - time.monotonic()))

    def wait_for_subscriber(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.pub.get_subscription_count() == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody subscribed to {self.topic} within {timeout:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.node.destroy_node()
        self.context.try_shutdown()


def run_flood(opts: FloodOptions, out=print) -> dict:
    """Runs the node set, the bag player and the flood windows; returns the figures."""
    from mstar_ros.bag.bundled import bundled_bag
    from mstar_ros.bag.ros_env import apply_localhost_defaults
    from mstar_ros.launch_spec import ProcessSpec, pi05_processes
    from mstar_ros.process_group import ProcessGroup

    apply_localhost_defaults()
    total = opts.warmup_s + len(ORDER) * opts.seconds
    with tempfile.TemporaryDirectory(prefix="mstar-flood-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        serving = threading.Event()
        extra = ["--summary-json", str(summary_path), "--preset", opts.preset, "--duration", repr(total + 120)]
        (node_set,) = pi05_processes(
            robots="/robot1 /robot2",
            weights=opts.weights,
            rate=opts.control_rate_hz,
            dtype=opts.dtype,
            extra_arguments=extra,
        )
        player = ProcessSpec(
            "bag_player",
            "mstar-ros",
            "mstar_ros.cli",
            arguments=(
                "bag",
                "play",
                str(bundled_bag()),
                "--loop",
                "--restamp",
                "--progress",
                "0",
                "--wait-timeout",
                "120",
            ),
        )
        group = ProcessGroup(out=lambda s: None)
        flooder = Flooder(opts.rate_hz)
        windows: list[tuple[str, float, float]] = []
        cpu: dict[str, float] = {"quiet": 0.0, "flood": 0.0}  # the node set process's CPU seconds per condition
        sent_in: dict[str, int] = {"quiet": 0, "flood": 0}
        try:
            proc = group.start(
                node_set, on_line=lambda line: serving.set() if line.startswith("serving pi0.5") else None
            )
            group.start(player, stdout=subprocess.DEVNULL)
            _wait(serving, 180, group, "the node set to serve")
            flooder.wait_for_subscriber(60)
            out(
                f"bench pi05 --flood: warming up {opts.warmup_s:g} s, then windows {', '.join(ORDER)} of "
                f"{opts.seconds:g} s; flood: {opts.rate_hz:g} bad frames/s on {FLOOD_TOPIC}"
            )
            time.sleep(opts.warmup_s)
            for kind in ORDER:
                (flooder.on.set if kind == "flood" else flooder.on.clear)()
                start, cpu0, sent0 = time.monotonic(), _cpu_seconds(proc.pid), flooder.sent
                time.sleep(opts.seconds)
                windows.append((kind, start, time.monotonic()))
                cpu[kind] += _cpu_seconds(proc.pid) - cpu0
                sent_in[kind] += flooder.sent - sent0
            flooder.on.clear()
        finally:
            codes = group.stop()
            flooder.close()
        if codes.get(node_set.name) not in (0, None) or not summary_path.is_file():
            raise RuntimeError(f"the node set exited with {codes.get(node_set.name)} and no summary")
        summary = json.loads(summary_path.read_text())
    result = figures(summary, windows, flooder.sent, opts)
    result["dtype"] = summary.get("dtype")  # what the node set's engines ran, and why
    from mstar_ros.bench.machine import machine_section

    result["machine"] = machine_section()
    per_window = {k: v / ORDER.count(k) for k, v in cpu.items()}
    result["node_set_cpu_s_per_window"] = {k: round(v, 2) for k, v in per_window.items()}
    if sent_in["flood"]:
        result["node_set_cpu_us_per_bad_frame"] = round((cpu["flood"] - cpu["quiet"]) / sent_in["flood"] * 1e6, 1)
    return result


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (/proc/PID/stat, clock ticks)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(event: threading.Event, timeout: float, group, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not event.wait(0.2):
        if group.exited() or time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} (exited: {group.exited()})")


def figures(summary: dict, windows: list[tuple[str, float, float]], sent: int, opts: FloodOptions) -> dict:
    """Robot 1's latencies per condition (chunks bucketed by the window they were published in)."""
    r1, r2 = summary["robots"]["/robot1"], summary["robots"]["/robot2"]
    by_kind: dict[str, list[float]] = {"quiet": [], "flood": []}
    for t, latency in zip(r1["chunk_times_s"], r1["latencies_ms"]):
        for kind, start, end in windows:
            if start <= t < end:
                by_kind[kind].append(latency)
    stats = {
        kind: {"chunks": len(v), "p50_ms": percentile(v, 50) if v else None, "p95_ms": percentile(v, 95) if v else None}
        for kind, v in by_kind.items()
    }
    if not (by_kind["quiet"] and by_kind["flood"]):
        raise RuntimeError(f"robot 1 got no chunk in some windows: {stats}")
    return {
        "seconds_per_window": opts.seconds,
        "order": list(ORDER),
        "flood_rate_hz": opts.rate_hz,
        "control_rate_hz": opts.control_rate_hz,
        "preset": opts.preset if not opts.weights else opts.weights,
        "robot1": stats,
        "robot1_p50_ratio": round(stats["flood"]["p50_ms"] / stats["quiet"]["p50_ms"], 3),
        "robot1_p95_ratio": round(stats["flood"]["p95_ms"] / stats["quiet"]["p95_ms"], 3),
        "flood_frames_sent": sent,
        "robot2_dropped_frames": r2["dropped_frames"],
        "robot2_chunks": r2["chunks"],
        "robot2_topics_shut": r2.get("topics_shut", 0),
        "robot2_sensor_losses": r2.get("sensor_losses", 0),
        "robot1_chunks": r1["chunks"],
        "robot1_dropped_frames": r1["dropped_frames"],
    }


def print_flood(result: dict, out=print) -> None:
    from mstar_ros.bench.machine import header_line

    out(header_line({"machine": result.get("machine", {})}) + f"; node set dtype {result.get('dtype')}")
    r = result["robot1"]
    out(
        f"robot 1 sensor-to-action latency, quiet: p50 {r['quiet']['p50_ms']:.1f} ms / p95 {r['quiet']['p95_ms']:.1f} "
        f"ms over {r['quiet']['chunks']} chunks; with robot 2 flooded: p50 {r['flood']['p50_ms']:.1f} ms / p95 "
        f"{r['flood']['p95_ms']:.1f} ms over {r['flood']['chunks']} chunks"
    )
    out(
        f"robot1_p50_ratio {result['robot1_p50_ratio']:.3f}, robot1_p95_ratio {result['robot1_p95_ratio']:.3f} "
        f"(goal <= 1.15); robot 2: {result['flood_frames_sent']} bad frames sent, {result['robot2_dropped_frames']} "
        f"received and dropped (its camera cut {result['robot2_topics_shut']} times, "
        f"{result['robot2_sensor_losses']} sensor losses), {result['robot2_chunks']} chunks served meanwhile"
    )
    if "node_set_cpu_us_per_bad_frame" in result:
        c = result["node_set_cpu_s_per_window"]
        out(
            f"node set CPU per window: quiet {c['quiet']:.2f} s, flood {c['flood']:.2f} s: "
            f"{result['node_set_cpu_us_per_bad_frame']:.0f} us per bad frame"
        )


def main_flood(args) -> int:
    opts = FloodOptions(
        seconds=args.seconds,
        warmup_s=args.flood_warmup,
        rate_hz=args.flood_rate,
        weights=str(args.weights or ""),
        preset=args.preset,
        dtype=args.dtype,
    )
    result = run_flood(opts)
    print_flood(result)
    json_path = Path(args.json or "bench-pi05-flood.json")
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {json_path}")
    sys.stdout.flush()
    return 0
