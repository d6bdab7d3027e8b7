"""``mstar-ros demo``: the pi0.5 node set serving two robots, driven by the bundled synthetic bag."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from mstar_ros.bag.bundled import bundled_bag
from mstar_ros.launch_spec import ProcessSpec, pi05_processes
from mstar_ros.process_group import ProcessGroup, wait_for_stop

DESCRIPTION = """\
Runs the product end to end on this machine, localhost only:

1. makes (first time) or reuses the bundled synthetic DROID-like bag: two robots
   (/robot1, /robot2), two 224x224 cameras and Franka + gripper joint states each,
   20 s, under $MSTAR_CACHE or ~/.cache/mstar_ros/bags;
2. starts the pi0.5 node set as `mstar-ros launch pi05` does (mstar_ros.launch_spec)
   and `mstar-ros bag play BAG --loop`;
3. after --seconds (or at Ctrl-C with --forever) stops both and prints what the node
   set served: action chunks per second, sensor-to-action latency p50/p95, joint names.

Without --weights the model is a generated tiny pi0.5 with RANDOM weights: the
system works end to end, the actions are noise. Logs go to out/demo/."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="pi0.5 node set serving two robots from the bundled synthetic bag (~20 s)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=20.0, help="how long to serve (default 20)")
    p.add_argument("--forever", action="store_true", help="serve until Ctrl-C")
    p.add_argument("--weights", default="", help="pi0.5 checkpoint dir (default: generated tiny, RANDOM weights)")
    p.add_argument("--rate", default="", help="control rate in Hz (default: config/pi05.yaml, 15)")
    p.add_argument("--bag", type=Path, help="play this bag instead (its robots are /robot1, /robot2, ...)")
    p.add_argument(
        "--robots", nargs="+", default=["/robot1", "/robot2"], help="robot namespaces (default /robot1 /robot2)"
    )
    p.add_argument("--logs", type=Path, default=Path("out/demo"), help="log directory (default out/demo)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mstar_ros.bag.ros_env import apply_localhost_defaults, describe_discovery

    apply_localhost_defaults()  # the processes inherit it: DDS stays on this host unless you widened it
    say = lambda s: print(s, flush=True)  # noqa: E731
    bag = args.bag or bundled_bag()
    args.logs.mkdir(parents=True, exist_ok=True)
    say(f"demo: bag {bag} (looping); {describe_discovery()}; logs in {args.logs}/")
    with tempfile.TemporaryDirectory(prefix="mstar-demo-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        extra = ["--summary-json", str(summary_path)]
        if not args.forever:
            extra += ["--duration", repr(float(args.seconds))]
        (node_set,) = pi05_processes(
            args.robots, args.weights, "", args.rate, "", status_every="5", extra_arguments=extra
        )
        player = ProcessSpec(
            "bag_player",
            "mstar-ros",
            "mstar_ros.cli",
            # restamped: the policy judges frames by header.stamp, and a looped recording's
            # stamps are old and repeat
            arguments=("bag", "play", str(bag), "--loop", "--restamp", "--progress", "0", "--wait-timeout", "120"),
        )
        group = ProcessGroup(out=lambda s: None)
        with open(args.logs / "node_set.log", "w") as ns_log, open(args.logs / "bag_player.log", "w") as bag_log:

            def on_line(line: str) -> None:
                ns_log.write(line + "\n")
                ns_log.flush()
                if line.startswith(("serving pi0.5", "status after", "mstar_pi05_node_set: error")):
                    say(f"node set: {line}")

            say(
                "demo: starting the pi0.5 node set ("
                + " ".join(node_set.command())
                + ") and the bag player; "
                + ("Ctrl-C stops" if args.forever else f"serving for {args.seconds:g} s")
            )
            try:
                group.start(node_set, on_line=on_line)
                group.start(player, stdout=bag_log)
                why = wait_for_stop(group, names=[node_set.name, player.name])
            finally:
                codes = group.stop()
        if why == player.name and codes[player.name] != 0:
            say(f"demo: the bag player failed (status {codes[player.name]}); see {args.logs}/bag_player.log")
            return 1
        if codes[node_set.name] != 0 or not summary_path.exists():
            say(f"demo: the node set failed (status {codes[node_set.name]}); see {args.logs}/node_set.log")
            return 1
        summary = json.loads(summary_path.read_text())
    print_demo_summary(summary, random_weights=not args.weights)
    served = all(r["chunks"] > 0 for r in summary["robots"].values())
    if not served:
        say("demo: some robot got no action chunk; see the logs")
    return 0 if served else 1


def print_demo_summary(summary: dict, *, random_weights: bool) -> None:
    robots = summary["robots"]
    print(
        f"\npi0.5 node set served {len(robots)} robots for {summary['seconds']:.1f} s"
        + (" (tiny model, RANDOM weights: the actions are noise)" if random_weights else "")
    )
    if summary.get("dtype"):
        print(f"  dtype {summary['dtype']}")
    print(
        f"  action chunks per second, all robots: {summary['chunks_per_s']} (paced by the robots: each runs "
        f"its actions at the control rate and asks for the next chunk when refill_at are left)"
    )
    for ns, r in robots.items():
        print(
            f"  {ns}/action_chunk: {r['chunks']} chunks, {r['chunks_per_s']} chunks/s, "
            f"sensor-to-action latency p50 {r['latency_p50_ms']} ms / p95 {r['latency_p95_ms']} ms; "
            f"{r['horizon']} actions per chunk at {r['rate_hz']:g} Hz, refill_at {r['refill_at']}; "
            f"{r['dropped_frames']} frames dropped; {r['fresh_waits']} requests waited for a fresher frame"
        )
        print(f"      joints: {', '.join(r['joint_names'])}")
    sys.stdout.flush()
