"""Does a flood of bad frames on one robot's camera slow another robot's V-JEPA 2-AC plans? (issue 28, point 9)

Runs the world-model node set for /robot1 and /robot2 (tiny random weights, config/vjepa2.yaml),
both fed by a generated world-model bag (``bag play --restamp``) over real DDS on this host, and
gives robot 1 a goal, so it plans after every frame. Time is cut into windows in ABBA order
(quiet, flood, flood, quiet, after a warm-up); in the flood windows this process publishes
malformed frames (rgba8) on robot 2's camera at ``--rate`` (400 by default). Robot 1's plans are
counted per window from the node set's summary (the monotonic time of each plan, one clock for
every process of this host): plans per second quiet and flooded is the figure. Robot 2's line of the node set's summary shows what its node did with the flood.

    python tools/world_model_flood.py [--seconds 15] [--warmup 10] [--rate 400] [--no-guard] [--json out.json]

``--no-guard`` runs the node set with ``max_bad_rate_hz:=0`` (never unsubscribe a flooding topic),
as it was before the guard.

Run nothing else meanwhile: it times the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ORDER = ("quiet", "flood", "flood", "quiet")
ROBOTS = ("/robot1", "/robot2")
FRAME = 64  # bag image size (pixels a side): the tiny model resizes whatever it gets


def _goal_until_planning(flooder, group, planning: threading.Event, timeout: float) -> None:
    """Sends robot 1 a goal (from the flooder's node) every 2 s until its node set says it took one: a goal
    before the robot's first frame is dropped."""
    from sensor_msgs.msg import Image

    pub = flooder.node.create_publisher(Image, "/robot1/goal_image", 10)
    goal = Image(encoding="rgb8", width=FRAME, height=FRAME, step=FRAME * 3)
    goal.data = bytes(range(256)) * (FRAME * FRAME * 3 // 256)
    deadline = time.monotonic() + timeout
    while not planning.wait(2.0):
        if group.exited() or time.monotonic() > deadline:
            raise RuntimeError(f"robot 1 took no goal within {timeout:.0f} s (exited: {group.exited()})")
        if pub.get_subscription_count():
            goal.header.stamp = flooder.node.get_clock().now().to_msg()
            pub.publish(goal)


def run(seconds: float, warmup_s: float, rate_hz: float, guard: bool = True) -> dict:
    from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag
    from mstar_ros.bag.ros_env import apply_localhost_defaults
    from mstar_ros.bench.machine import machine_section
    from mstar_ros.bench.pi05_flood import Flooder
    from mstar_ros.launch_spec import ProcessSpec, vjepa2_processes
    from mstar_ros.process_group import ProcessGroup

    apply_localhost_defaults()
    total = warmup_s + len(ORDER) * seconds
    with tempfile.TemporaryDirectory(prefix="mstar-wm-flood-") as tmp:
        bag = write_end_effector_bag(
            Path(tmp) / "wm", EndEffectorBagSpec(robots=2, seconds=8.0, seed=1, width=FRAME, height=FRAME)
        )
        summary_path = Path(tmp) / "summary.json"
        (node_set,) = vjepa2_processes(
            " ".join(ROBOTS),
            extra_arguments=["--summary-json", str(summary_path), "--duration", repr(total + 180)],
            ros_arguments=[] if guard else ["-p", "max_bad_rate_hz:=0.0"],
        )
        player = ProcessSpec(
            "bag_player",
            "mstar-ros",
            "mstar_ros.cli",
            arguments=(
                "bag",
                "play",
                str(bag),
                "--loop",
                "--restamp",
                "--progress",
                "0",
                "--wait-timeout",
                "120",
                "--topics",
                "/robot1/camera",
                "/robot1/ee_pose",
                "/robot1/gripper",
                "/robot2/camera",
                "/robot2/ee_pose",
                "/robot2/gripper",
            ),
        )
        group = ProcessGroup(out=lambda s: None)
        flooder = Flooder(rate_hz, "/robot2/camera/exterior/image_raw")
        planning = threading.Event()
        windows: list[tuple[str, float, float]] = []
        try:
            group.start(node_set, on_line=lambda line: planning.set() if "goal set: planning" in line else None)
            group.start(player, stdout=subprocess.DEVNULL)
            _goal_until_planning(flooder, group, planning, 240)
            flooder.wait_for_subscriber(60)
            print(
                f"warming up {warmup_s:g} s, then windows {', '.join(ORDER)} of {seconds:g} s; flood: "
                f"{rate_hz:g} bad frames/s on {flooder.topic}",
                flush=True,
            )
            time.sleep(warmup_s)
            for kind in ORDER:
                (flooder.on.set if kind == "flood" else flooder.on.clear)()
                start = time.monotonic()
                time.sleep(seconds)
                windows.append((kind, start, time.monotonic()))
            flooder.on.clear()
        finally:
            codes = group.stop()
            flooder.close()
        if not summary_path.is_file():
            raise RuntimeError(f"the node set exited with {codes.get(node_set.name)} and no summary")
        summary = json.loads(summary_path.read_text())
    times = summary["robots"]["/robot1"].pop("plan_times_s")  # monotonic: the clock of every process here
    summary["robots"]["/robot2"].pop("plan_times_s")
    rates = {}
    for kind in ("quiet", "flood"):
        spans = [(s, e) for k, s, e in windows if k == kind]
        plans = sum(1 for t in times for s, e in spans if s <= t < e)
        rates[kind] = round(plans / sum(e - s for s, e in spans), 2)
    return {
        "robot1_plans_per_s": rates,
        "flood_guard": guard,
        "flood_rate_hz": rate_hz,
        "seconds_per_window": seconds,
        "order": list(ORDER),
        "flood_frames_sent": flooder.sent,
        "robots": summary["robots"],
        "dtype": summary.get("dtype"),
        "machine": machine_section(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds per window (default 15)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after the first plan, before the windows")
    parser.add_argument("--rate", type=float, default=400.0, help="bad frames per second in the flood windows")
    parser.add_argument("--no-guard", action="store_true", help="max_bad_rate_hz:=0: flooding topics stay subscribed")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    result = run(args.seconds, args.warmup, args.rate, guard=not args.no_guard)
    r = result["robot1_plans_per_s"]
    print(
        f"flood guard {'on' if result['flood_guard'] else 'off'}: robot 1 plans/s quiet {r['quiet']:.2f}, robot 2's "
        f"camera flooded at {args.rate:g}/s {r['flood']:.2f} (ratio {r['flood'] / r['quiet']:.2f}); "
        f"{result['flood_frames_sent']} bad frames sent"
    )
    for ns, robot in result["robots"].items():
        print(f"  {ns}: {json.dumps(robot)}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
