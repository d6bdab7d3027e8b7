"""``mstar-ros bench transport --quick`` as a user runs it: a fresh process, no pool token in the environment.

Every transport kind is measured (mooncake included: CI installs it, and a missing package
fails here rather than skipping), and the report has every table and headline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mstar.transport.tcp import SECRET_ENV


@pytest.mark.slow
def test_bench_transport_quick_measures_every_transport_and_writes_report_and_plot(tmp_path):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}  # the token is the bench's own business
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "transport",
            "--quick",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    section = report["transport"]
    assert section["sizes"] == [4096, 1 << 20] and section["repeats"] == 3
    assert section["skipped"] == {}
    assert set(section["transports"]) == {"inline", "shm", "tcp", "mooncake"}
    for kind, table in section["transports"].items():
        for size in ("4096", str(1 << 20)):
            row = table[size]
            assert row["latency_us_p50"] > 0 and row["bandwidth_gbps"] > 0, (kind, size)
            assert row["vs_memcpy"] == row["bandwidth_gbps"] / section["memcpy"][size]["bandwidth_gbps"]
    assert section["shm_latency_4kb_us"] == section["transports"]["shm"]["4096"]["latency_us_p50"]
    assert section["shm_vs_memcpy_64mb"] is None  # 64MB is not among the quick sizes
    split = report["orpheus_split"]
    assert split["preset"] == "tiny" and split["dtype"]["requested"] == "auto"  # as every bench: dtype auto
    assert report["machine"]["cpu_capability"] and report["machine"]["threads"] >= 1
    for side in ("single_process", "two_processes"):
        assert split[side]["requests"] == 2 and split[side]["throughput_audio_s_per_s"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 1000
    assert "bandwidth, GB/s" in run.stdout and "refused" not in run.stderr


def test_bench_transport_options_given_win_over_quick(tmp_path):
    from mstar_ros.bench.transport import apply_defaults
    from mstar_ros.cli.main import build_parser

    args = build_parser().parse_args(["bench", "transport", "--quick", "--repeats", "7"])
    apply_defaults(args)
    assert (args.sizes, args.repeats, args.orpheus_requests, args.orpheus_preset) == ("4K,1M", 7, 2, "tiny")
    args = build_parser().parse_args(["bench", "transport"])
    apply_defaults(args)
    assert (args.sizes, args.repeats, args.orpheus_requests) == ("4K,16K,64K,256K,1M,4M,16M,64M", 50, 16)
