"""``mstar-ros``: the command line of mstar_ros."""

from __future__ import annotations

import argparse
import logging
import sys

DESCRIPTION = """\
mstar_ros serves composite multimodal models (Orpheus TTS, pi0.5, BAGEL, ...) on the
Walk Graph runtime: a Conductor plus Workers running each model's graph of
components with continuous batching and a paged KV cache.

Without --weights, every command uses a small generated checkpoint with RANDOM
weights (made once, cached under $MSTAR_CACHE or ~/.cache/mstar_ros): it shows the
system working end to end, not real speech."""


def build_parser() -> argparse.ArgumentParser:
    from mstar_ros.cli import (
        bag,
        bagel,
        bench,
        bench_bagel,
        bench_decode,
        bench_mixed,
        bench_pi05,
        bench_qwen3_omni,
        bench_rollout,
        bench_threads,
        bench_transport,
        bench_webrtc,
        checkpoint,
        demo,
        launch,
        serve,
        tts,
    )

    parser = argparse.ArgumentParser(
        prog="mstar-ros", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tts.add_parser(sub)
    serve.add_parser(sub)
    bench.add_parser(sub)
    bench_transport.add_parser(sub)  # `bench transport`, under bench
    bench_pi05.add_parser(sub)  # `bench pi05`, under bench
    bench_threads.add_parser(sub)  # `bench threads`, under bench
    bench_rollout.add_parser(sub)  # `bench rollout`, under bench
    bench_webrtc.add_parser(sub)  # `bench webrtc`, under bench
    bench_mixed.add_parser(sub)  # `bench mixed`, under bench
    bench_qwen3_omni.add_parser(sub)  # `bench qwen3-omni`, under bench
    bench_bagel.add_parser(sub)  # `bench bagel`, under bench
    bench_decode.add_parser(sub)  # `bench decode`, under bench
    bag.add_parser(sub)
    checkpoint.add_parser(sub)
    launch.add_parser(sub)  # the pi0.5 and Orpheus node sets: `launch pi05`, `launch orpheus`
    demo.add_parser(sub)
    bagel.add_parser(sub)  # `bagel ask|generate|edit`
    return parser


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.omp_defaults import apply_spin_default

    apply_spin_default()  # before build_parser imports torch: see mstar_ros.omp_defaults
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"mstar-ros {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
