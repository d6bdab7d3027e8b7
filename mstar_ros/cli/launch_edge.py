"""``mstar-ros launch edge``: the whole edge box (pi0.5 robots, the voice gateway, BAGEL images) from one config.

The processes of mstar_ros.edge.launch_spec (what ``ros2 launch mstar_ros edge.launch.py`` starts), one
per process group of the edge config, supervised as ``mstar-ros launch pi05`` supervises its node set.
"""

from __future__ import annotations

import argparse

from mstar_ros.edge.launch_spec import EDGE_LAUNCH_ARGUMENTS, edge_processes

DESCRIPTION = """\
Start the edge box: every front-end of the edge config (default config/edge.yaml) -- pi0.5 for the
robots (NS/camera/*/image_raw + NS/joint_states in, NS/action_chunk out), the voice gateway (WebRTC
peers, WHIP, POST /v1/audio/speech) and BAGEL's /v1/images/generations on the same HTTP server --
one process per process group of the config. The models of one group share that process's device
thread, whose engines step control requests (pi0.5 chunks) before interactive (voice) before batch
(images); each group runs on the intra-op threads the config gives it, and the config is refused
when they add up to more than this machine's cores (unless it says oversubscribe: true).
The same processes as `ros2 launch mstar_ros edge.launch.py config:=FILE`.

  mstar-ros launch edge --status-every 5 &
  mstar-ros bag play BAG --loop --restamp &
  curl -s localhost:8080/v1/audio/speech -d '{"model":"orpheus","input":"Hello.","voice":"tara"}' -o hello.mp3

DDS stays on 127.0.0.1 (config/fastdds_localhost.xml) unless you set
ROS_AUTOMATIC_DISCOVERY_RANGE or FASTDDS_DEFAULT_PROFILES_FILE yourself."""


def add_parser(targets: argparse._SubParsersAction, add_run_options, ros_args_help: str) -> None:
    helps = {a.name: a.description for a in EDGE_LAUNCH_ARGUMENTS}
    p = targets.add_parser(
        "edge",
        help="the whole edge box (pi0.5, voice, images) from config/edge.yaml",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default="", help=helps["config"])
    p.add_argument("--status-every", default="0", metavar="S", help=helps["status_every"])
    add_run_options(p, helps["dtype"], summary=True, ros_args=ros_args_help)  # --summary-json: one file per process
    p.set_defaults(run=run_edge)


def run_edge(args: argparse.Namespace) -> int:
    from mstar_ros.cli.launch import _start

    specs = edge_processes(
        args.config,
        args.status_every,
        args.dtype,
        args.use_sim_time,
        summary_json=args.summary_json or "",
        extra_arguments=["--duration", repr(float(args.duration))] if args.duration else [],
        ros_arguments=args.ros_args,
    )
    return _start(specs, args.print_commands)
