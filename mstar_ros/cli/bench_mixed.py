"""``mstar-ros bench mixed``: pi0.5 control latency alone vs beside voice peers and a batch image job."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Adds ``mixed`` under the ``bench`` command (call after mstar_ros.cli.bench.add_parser)."""
    p = bench_subparsers(sub).add_parser(
        "mixed",
        help="the edge box: robots' sensor-to-action p95 alone vs with voice peers and a batch image job",
        description="The edge box as config/edge.yaml runs it: pi0.5 and the voice model in this process "
        "(one Conductor each, one device thread; pi0.5 control > voice interactive), BAGEL's image job in a "
        "process of its own under SCHED_IDLE. In one run: --robots robots at --hz alone (sensor-to-action "
        "p95), the voice peers alone (RTF), then the robots while --peers voice peers speak and the batch "
        "process makes images back to back; then the same with BAGEL in this process (class batch), and "
        "that with priority classes switched off (EngineConfig(priority_classes=False)). Reports "
        "control_p95_ratio (loaded / alone; goal <= 1.25), the share of chunks later than the robot's "
        "refill point (goal < 1%), the voice RTF (goal < 1) and where the chunks' time went on the device "
        "(by class and engine). JSON and a PNG; run it on a quiet machine (other torch processes on the "
        "same cores swing every figure).",
    )
    p.add_argument("--robots", type=int, default=2, help="robots (default 2)")
    p.add_argument("--hz", type=float, default=10.0, help="observations per second per robot (default 10)")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds per robots' measurement (default 20)")
    p.add_argument("--voice-seconds", type=float, default=10.0, help="seconds of the voice peers alone (default 10)")
    p.add_argument(
        "--chunk-period",
        type=float,
        default=None,
        help="seconds between a robot's chunk requests (default: its refill cadence, the actions it runs from a "
        "chunk before its refill point at config/pi05.yaml's control rate; 0: as soon as the last chunk returned, "
        "which saturates the box)",
    )
    p.add_argument("--peers", type=int, default=4, help="voice peers speaking at once (default 4)")
    p.add_argument(
        "--voice-pause",
        type=float,
        default=1.0,
        help="seconds a peer's user talks after an answer has played out, before the next answer is asked "
        "(default 1; negative: answers back to back, as fast as they are made)",
    )
    p.add_argument("--max-tokens", type=int, default=280, help="audio tokens per voice answer (default 280)")
    p.add_argument("--image-steps", type=int, default=None, help="flow steps per image (default: the model's)")
    p.add_argument("--pi05-preset", default="bench", help="generated pi0.5 preset (default bench)")
    p.add_argument("--orpheus-preset", default="bench", help="generated Orpheus preset (default bench)")
    p.add_argument("--bagel-preset", default="bench", help="generated BAGEL preset (default bench)")
    p.add_argument("--pi05-weights", type=Path, help="real pi0.5 checkpoint instead of the generated one")
    p.add_argument("--orpheus-weights", type=Path, help="real Orpheus checkpoint instead of the generated one")
    p.add_argument("--bagel-weights", type=Path, help="real BAGEL checkpoint instead of the generated one")
    p.add_argument("--seed", type=int, default=0, help="synthetic bag seed")
    p.add_argument(
        "--voice-engine-config",
        default=None,
        help="the voice model's engine settings YAML (default: config/engine_voice.yaml, as config/edge.yaml "
        'serves it: its forward compiled; "": the engine defaults, eager)',
    )
    add_dtype_argument(p)
    p.add_argument("--json", type=Path, default=Path("bench-mixed.json"), help="where to write the figures")
    p.add_argument("--plot", type=Path, default=Path("bench-mixed.png"), help="where to write the plot")
    p.add_argument(
        "--quick", action="store_true", help="a smoke test of the bench code: tiny models, seconds-long phases"
    )
    p.set_defaults(run=_run_mixed)


def _run_mixed(args: argparse.Namespace) -> int:
    if args.quick:
        args.seconds, args.voice_seconds, args.max_tokens, args.image_steps = 1.5, 1.0, 28, 2
        args.pi05_preset = args.orpheus_preset = args.bagel_preset = "tiny"
    if not (args.seconds > 0 and args.voice_seconds > 0 and args.hz > 0):
        raise ValueError("--seconds, --voice-seconds and --hz must be positive")
    if args.robots < 1 or args.peers < 1 or args.max_tokens < 1:
        raise ValueError("--robots, --peers and --max-tokens must be >= 1")
    if args.voice_engine_config is None:
        from mstar_ros.config_files import find_config

        args.voice_engine_config = str(find_config("engine_voice.yaml") or "")
    from mstar_ros.bench.mixed import run_mixed_bench

    return run_mixed_bench(args)
