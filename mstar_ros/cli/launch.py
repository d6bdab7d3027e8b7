"""``mstar-ros launch pi05``: the pi0.5 node set where the ROS 2 launch tools are not installed.

Starts the processes of mstar_ros.launch_spec (what ``ros2 launch mstar_ros pi05.launch.py``
starts) as subprocesses and supervises them: Ctrl-C or SIGTERM stops them all (SIGINT,
then SIGTERM, then SIGKILL), and when one exits the others are stopped too. A process that
fails ends the group with its exit status and its one-line error (the last line it wrote
to stderr), as the launch files end a launch (mstar_ros.launch_actions).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from mstar.engine.dtype_names import DTYPE_NAMES
from mstar_ros.launch_spec import (
    LAUNCH_ARGUMENTS,
    ORPHEUS_LAUNCH_ARGUMENTS,
    USE_SIM_TIME_ARGUMENT,
    VJEPA2_LAUNCH_ARGUMENTS,
    ProcessSpec,
    orpheus_processes,
    pi05_processes,
    vjepa2_processes,
)
from mstar_ros.process_group import ProcessGroup, wait_for_stop

_HELP = {a.name: a.description for a in LAUNCH_ARGUMENTS}

DESCRIPTION = """\
Start the pi0.5 node set: one process hosting the Conductor, /mstar/conductor (runtime
state on /diagnostics) and one pi05_policy node per robot namespace, which subscribes
to NS/camera/*/image_raw and NS/joint_states and publishes NS/action_chunk
(trajectory_msgs/JointTrajectory). The same processes as
`ros2 launch mstar_ros pi05.launch.py robots:='/robot1 /robot2'` (mstar_ros.launch_spec).

Parameters come from --params-file (default config/pi05.yaml); --rate and --prompt win
over it. Everything after --ros-args goes to the node set after its own ROS arguments, so
it wins:

  mstar-ros launch pi05 --robots /robot1 /robot2 --prompt "stack the red block" \\
      --status-every 5 --ros-args -r /robot1/action_chunk:=/arm_left/trajectory

If the node set fails (a bad weights path or placement) this exits with its status and
its one-line error, as `ros2 launch` does with the launch file.

DDS stays on 127.0.0.1 (config/fastdds_localhost.xml) unless you set
ROS_AUTOMATIC_DISCOVERY_RANGE or FASTDDS_DEFAULT_PROFILES_FILE yourself."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    launch = sub.add_parser(
        "launch",
        help="start a node set (pi05, orpheus, vjepa2, bagel, bagel-vjepa2, edge) without the ROS 2 launch tools",
        description="Start a node set described in mstar_ros.launch_spec.",
    )
    targets = launch.add_subparsers(dest="launch_target", required=True, metavar="NODE_SET")
    p = targets.add_parser(
        "pi05",
        help="the pi0.5 policy node set",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--robots", nargs="+", default=["/robot1"], help=_HELP["robots"] + " (default /robot1)")
    p.add_argument("--weights", default="", help=_HELP["weights"])
    p.add_argument("--placement", default="", help=_HELP["placement"])
    p.add_argument("--rate", default="", help=_HELP["rate"])
    p.add_argument("--params-file", default="", help=_HELP["params_file"])
    p.add_argument("--max-inflight", default="0", metavar="K", help=_HELP["max_inflight"])
    p.add_argument("--prompt", default="", help=_HELP["prompt"])
    p.add_argument("--status-every", default="0", metavar="S", help=_HELP["status_every"])
    p.add_argument("--tokenizer", default="", help=_HELP["tokenizer"])
    p.add_argument("--asset-id", default="", help=_HELP["asset_id"])
    _add_run_options(
        p,
        _HELP["dtype"],
        summary=True,
        ros_args="ROS arguments for the node set (-r FROM:=TO, -p NAME:=VALUE, --params-file F, ...)",
    )
    p.set_defaults(run=run)
    _add_orpheus(targets)
    _add_vjepa2(targets)
    from mstar_ros.cli.launch_bagel import add_parsers as add_bagel_parsers

    add_bagel_parsers(targets, _add_run_options, ROS_ARGS_EVERY_NODE)
    from mstar_ros.cli.launch_edge import add_parser as add_edge_parser

    add_edge_parser(targets, _add_run_options, ROS_ARGS_EVERY_NODE)


ORPHEUS_DESCRIPTION = """\
Start Orpheus TTS as ROS 2 nodes. Split (the default), its two partitions run as two
nodes in two processes joined by a topic: NS/orpheus_talker takes text on NS/text
(std_msgs/String: the text, or JSON {"text", "id", "seed", "max_tokens", "temperature"})
and publishes audio tokens on NS/llm_token as they are sampled; NS/orpheus_vocoder
decodes them (28-token windows every 7) and publishes 24 kHz PCM on NS/audio
(std_msgs/Float32MultiArray, one message per chunk, the stream header in
layout.dim[0].label). --no-split: one node. The same processes as
`ros2 launch mstar_ros orpheus.launch.py split:=true namespace:=/tts`.

  mstar-ros launch orpheus &
  ros2 topic pub --once /tts/text std_msgs/msg/String '{data: Hello there.}'
  ros2 topic echo /tts/llm_token"""


def _add_run_options(p: argparse.ArgumentParser, dtype_help: str, summary: bool, ros_args: str) -> None:
    """The options every node set's target shares: dtype, sim time, how long, what to print, ROS args."""
    p.add_argument("--dtype", default="auto", choices=DTYPE_NAMES, help=dtype_help)
    p.add_argument(
        "--use-sim-time",
        action="store_true",
        help=USE_SIM_TIME_ARGUMENT.description.replace("true: every", "every") + " (use_sim_time:=true)",
    )
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    if summary:
        p.add_argument("--summary-json", help="the node set writes its summary here as JSON when it stops")
    p.add_argument("--print-commands", action="store_true", help="print the commands and exit")
    p.add_argument("--ros-args", dest="ros_args", nargs=argparse.REMAINDER, default=[], metavar="ARG", help=ros_args)


def _run_arguments(args: argparse.Namespace) -> list[str]:
    """What the node set's own command line gets from those options."""
    extra = ["--duration", repr(float(args.duration))] if args.duration else []
    if getattr(args, "summary_json", None):
        extra += ["--summary-json", args.summary_json]
    return extra


ROS_ARGS_EVERY_NODE = "ROS arguments for every node (-r FROM:=TO, -p NAME:=VALUE, ...)"


def _add_orpheus(targets: argparse._SubParsersAction) -> None:
    helps = {a.name: a.description for a in ORPHEUS_LAUNCH_ARGUMENTS}
    p = targets.add_parser(
        "orpheus",
        help="Orpheus TTS, one node per partition",
        description=ORPHEUS_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--no-split", dest="split", action="store_false", help="the whole graph in one node")
    p.add_argument("--namespace", default="/tts", help=helps["namespace"] + " (default /tts)")
    p.add_argument("--weights", default="", help=helps["weights"])
    p.add_argument("--snac-weights", default="", help=helps["snac_weights"])
    _add_run_options(p, helps["dtype"], summary=False, ros_args=ROS_ARGS_EVERY_NODE)
    p.set_defaults(run=run_orpheus)


def run_orpheus(args: argparse.Namespace) -> int:
    extra = _run_arguments(args)
    specs = orpheus_processes(
        args.split,
        args.namespace,
        args.weights,
        args.snac_weights,
        args.dtype,
        args.use_sim_time,
        extra_arguments=extra,
        ros_arguments=args.ros_args,
    )
    return _start(specs, args.print_commands)


VJEPA2_DESCRIPTION = """\
V-JEPA 2-AC world models, one node per robot namespace, in one process with the runtime
(the embedded default). Each NS/world_model node takes the camera (NS/camera/exterior/image_raw),
the end-effector pose (NS/ee_pose, geometry_msgs/PoseStamped) and the gripper
(NS/gripper/joint_states); frames at 4 fps extend the robot's session, whose K/V are kept across
messages. A goal image on NS/goal_image starts planning (CEM): NS/plan/target_pose,
NS/plan/path, NS/plan/gripper and NS/plan/energy after every frame. Parameters:
config/vjepa2.yaml. The same as `ros2 launch mstar_ros vjepa2.launch.py robots:='/robot1'`.

  mstar-ros bag make-world-model out/wm && mstar-ros launch vjepa2 --robots /robot1 &
  mstar-ros bag play out/wm --loop"""


def _add_vjepa2(targets: argparse._SubParsersAction) -> None:
    helps = {a.name: a.description for a in VJEPA2_LAUNCH_ARGUMENTS}
    p = targets.add_parser(
        "vjepa2",
        help="V-JEPA 2-AC world models, one node per robot",
        description=VJEPA2_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--robots", nargs="+", default=["/robot1"], help=helps["robots"] + " (default /robot1)")
    p.add_argument("--weights", default="", help=helps["weights"])
    p.add_argument("--params-file", default="", help=helps["params_file"])
    _add_run_options(p, helps["dtype"], summary=True, ros_args=ROS_ARGS_EVERY_NODE)
    p.set_defaults(run=run_vjepa2)


def run_vjepa2(args: argparse.Namespace) -> int:
    extra = _run_arguments(args)
    specs = vjepa2_processes(
        " ".join(args.robots),
        args.weights,
        args.params_file,
        args.dtype,
        args.use_sim_time,
        extra_arguments=extra,
        ros_arguments=args.ros_args,
    )
    return _start(specs, args.print_commands)


def run(args: argparse.Namespace) -> int:
    extra = _run_arguments(args)
    specs = pi05_processes(
        args.robots,
        args.weights,
        args.placement,
        args.rate,
        args.params_file,
        args.max_inflight,
        args.prompt,
        args.status_every,
        args.tokenizer,
        args.asset_id,
        args.dtype,
        args.use_sim_time,
        extra_arguments=extra,
        ros_arguments=args.ros_args,
    )
    return _start(specs, args.print_commands)


def _start(specs: Sequence[ProcessSpec], print_commands: bool) -> int:
    if print_commands:
        for spec in specs:
            print(" ".join(spec.command()))
        return 0
    from mstar_ros.bag.ros_env import apply_localhost_defaults

    apply_localhost_defaults()  # inherited by the processes
    return run_processes(specs)


def run_processes(specs: Sequence[ProcessSpec]) -> int:
    group = ProcessGroup()
    try:
        for spec in specs:
            group.start(spec)
        why = wait_for_stop(group)
    finally:
        codes = group.stop()
    for name, code in codes.items():
        group.out(f"[launch] {name} exited with status {code}")
    if why != "signal" and codes[why] != 0:
        print(f"mstar-ros launch: error: {group.failure(why, codes[why])}", file=sys.stderr, flush=True)
        return codes[why]
    return 0 if all(c in (0, -signal.SIGINT, 130) for c in codes.values()) else 1
