"""``mstar-ros bench webrtc``: the voice gateway with aiortc peers on loopback, against in-process and whole-file."""

from __future__ import annotations

import argparse
from pathlib import Path

from mstar_ros.cli.bench import bench_subparsers, positive_ints, write_report
from mstar_ros.dtype_option import add_dtype_argument


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = bench_subparsers(sub).add_parser(
        "webrtc",
        help="the WebRTC voice gateway: time to first audio at the peer, gateway overhead, underruns",
        description="Serves a speech model behind the voice gateway on 127.0.0.1 and connects N aiortc peers "
        "(--peers levels) that all ask for a response at once, --rounds times. Per response: time to "
        "first audio at the peer (response.create sent -> first audible decoded frame), the same "
        "request's time to first audio in process (-> first chunk out of the Conductor) and their "
        "difference (the gateway's overhead), underruns (silent frames sent mid-utterance) next to the "
        "response's RTF, and RTP jitter; then the same requests through POST /v1/audio/speech read as "
        "a whole file. Prints the table and the goals; writes JSON and a PNG.",
    )
    p.add_argument("--peers", type=positive_ints, default=[1, 2, 4, 8], help="peers at once (default 1,2,4,8)")
    p.add_argument("--rounds", type=int, default=3, help="responses per peer per level (default 3)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=280,
        help="tokens per response (default 280: 40 SNAC frames, ~3.4 s of Orpheus audio)",
    )
    p.add_argument("--model", default="orpheus", help="speech model (default orpheus)")
    p.add_argument("--preset", default="bench", choices=["tiny", "bench"], help="generated checkpoint (default bench)")
    p.add_argument("--weights", type=Path, help="a real checkpoint directory instead")
    add_dtype_argument(p)
    p.add_argument(
        "--placement",
        type=Path,
        help="placement YAML: the model's nodes in Worker processes, off the gateway's interpreter "
        "(e.g. config/placement/orpheus-one-worker.yaml)",
    )
    p.add_argument("--json", type=Path, default=Path("bench-webrtc.json"), help="where to write the figures")
    p.add_argument("--plot", type=Path, default=Path("bench-webrtc.png"), help="where to write the plot")
    p.add_argument("--quick", action="store_true", help="a small run for smoke tests (tiny preset, 1,2 peers, 1 round)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from mstar_ros.bench.webrtc import WebrtcBenchOptions, run_webrtc_bench, summary_lines
    from mstar_ros.bench.webrtc_plot import plot_webrtc

    if args.rounds < 1 or args.max_tokens < 7:
        raise ValueError("--rounds >= 1 and --max-tokens >= 7 (one SNAC frame) are needed")
    opts = WebrtcBenchOptions(
        peers=args.peers,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        model=args.model,
        weights=args.weights,
        preset=args.preset,
        dtype=args.dtype,
        placement=args.placement,
    )
    if args.quick:
        opts.preset, opts.peers, opts.rounds, opts.max_tokens = "tiny", [1, 2], 1, 70
    report = run_webrtc_bench(opts)
    write_report(report, summary_lines(report), args.json, plot_webrtc, args.plot)
    return 0
