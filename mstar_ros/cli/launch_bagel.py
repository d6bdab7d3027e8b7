"""``mstar-ros launch bagel`` and ``mstar-ros launch bagel-vjepa2``: the BAGEL node set, alone or beside the
V-JEPA 2-AC node set, where the ROS 2 launch tools are not installed (the same processes as
``bagel.launch.py`` and ``bagel_vjepa2.launch.py``, from mstar_ros.launch_spec_bagel)."""

from __future__ import annotations

import argparse

from mstar_ros.launch_spec_bagel import (
    BAGEL_LAUNCH_ARGUMENTS,
    BAGEL_VJEPA2_LAUNCH_ARGUMENTS,
    bagel_processes,
    bagel_vjepa2_processes,
)

BAGEL_DESCRIPTION = """\
BAGEL, one node per namespace, in one process with the runtime. Each NS/bagel node keeps the
newest frame of NS/camera/exterior/image_raw; a question on NS/bagel/question (std_msgs/String)
is answered on NS/bagel/answer, an instruction on NS/bagel/edit edits that frame into a goal
image on NS/goal_image (sensor_msgs/Image rgb8, stamped as its source frame). Parameters:
config/bagel.yaml. The same as `ros2 launch mstar_ros bagel.launch.py robots:='/robot1'`.

  mstar-ros launch bagel --robots /robot1 &
  ros2 topic pub --once /robot1/bagel/question std_msgs/msg/String '{data: "What is on the table?"}'"""

COMPOSITE_DESCRIPTION = """\
BAGEL imagines the goal, V-JEPA 2-AC plans toward it: the BAGEL and the V-JEPA 2-AC node sets
over the same robot namespaces. An instruction on NS/bagel/edit has NS/bagel edit the latest
camera frame into NS/goal_image, which NS/world_model plans toward (NS/plan/path, ...). The
same as `ros2 launch mstar_ros bagel_vjepa2.launch.py robots:='/robot1'`.

  mstar-ros bag make-world-model out/wm && mstar-ros launch bagel-vjepa2 &
  mstar-ros bag play out/wm --loop --restamp --topics /robot1/camera /robot1/ee_pose /robot1/gripper &
  ros2 topic pub --once /robot1/bagel/edit std_msgs/msg/String '{data: "the cup in the drawer"}'"""


def add_parsers(targets: argparse._SubParsersAction, add_run_options, ros_args_help: str) -> None:
    """The two targets; ``add_run_options(parser, dtype_help, summary, ros_args)`` adds the options every
    target shares (mstar_ros.cli.launch)."""
    helps = {a.name: a.description for a in BAGEL_LAUNCH_ARGUMENTS}
    p = targets.add_parser(
        "bagel",
        help="BAGEL, one node per namespace (questions answered, goal images)",
        description=BAGEL_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--robots", nargs="+", default=["/robot1"], help=helps["robots"] + " (default /robot1)")
    p.add_argument("--weights", default="", help=helps["weights"])
    p.add_argument("--placement", default="", help=helps["placement"])
    p.add_argument("--params-file", default="", help=helps["params_file"])
    add_run_options(p, helps["dtype"], summary=True, ros_args=ros_args_help)
    p.set_defaults(run=run_bagel)
    helps = {a.name: a.description for a in BAGEL_VJEPA2_LAUNCH_ARGUMENTS}
    c = targets.add_parser(
        "bagel-vjepa2",
        help="BAGEL's goal images planned toward by V-JEPA 2-AC world models",
        description=COMPOSITE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--robots", nargs="+", default=["/robot1"], help=helps["robots"] + " (default /robot1)")
    for name in ("bagel_weights", "vjepa2_weights", "bagel_params_file", "vjepa2_params_file"):
        c.add_argument(f"--{name.replace('_', '-')}", default="", help=helps[name])
    add_run_options(c, helps["dtype"], summary=False, ros_args=ros_args_help + " (both node sets)")
    c.set_defaults(run=run_bagel_vjepa2)


def _run_arguments(args: argparse.Namespace) -> list[str]:
    extra = ["--duration", repr(float(args.duration))] if args.duration else []
    if getattr(args, "summary_json", None):
        extra += ["--summary-json", args.summary_json]
    return extra


def run_bagel(args: argparse.Namespace) -> int:
    from mstar_ros.cli.launch import _start

    specs = bagel_processes(
        " ".join(args.robots),
        args.weights,
        args.placement,
        args.params_file,
        args.dtype,
        args.use_sim_time,
        extra_arguments=_run_arguments(args),
        ros_arguments=args.ros_args,
    )
    return _start(specs, args.print_commands)


def run_bagel_vjepa2(args: argparse.Namespace) -> int:
    from mstar_ros.cli.launch import _start

    extra = _run_arguments(args)
    specs = bagel_vjepa2_processes(
        " ".join(args.robots),
        args.bagel_weights,
        args.vjepa2_weights,
        args.bagel_params_file,
        args.vjepa2_params_file,
        args.dtype,
        args.use_sim_time,
        bagel_extra_arguments=extra,
        vjepa2_extra_arguments=extra,
        bagel_ros_arguments=args.ros_args,
        vjepa2_ros_arguments=args.ros_args,
    )
    return _start(specs, args.print_commands)
