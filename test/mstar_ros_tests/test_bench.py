"""The benchmark command runs end to end (a smoke run: the figures themselves are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.bench_reports import assert_machine_and_dtypes


@pytest.mark.slow
def test_bench_orpheus_quick_writes_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "orpheus",
            "--quick",
            "--preset",
            "tiny",
            "--concurrency",
            "1,8",
            "--repeats",
            "2",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out_json.read_text())
    for key in ("throughput_ratio_c8", "ttfa_ratio_c8", "token_throughput_ratio_c8"):
        assert report[key] > 0
    for level in ("1", "8"):
        for system in ("ours", "baseline_sequential", "baseline_static"):
            figures = report["levels"][level][system]
            assert figures["requests"] == 4 and figures["audio_seconds"] > 0 and figures["ttfa_p50_ms"] > 0
            # the same greedy work for everyone: audio tokens per second exceed audio seconds per second x 7/0.085
            assert figures["audio_tokens_per_s"] >= figures["throughput_audio_s_per_s"] * 7 / (2048 / 24000) * 0.99
    assert report["model"]["random_weights"] is True
    assert report["workload"]["repeats"] == 2
    for level in report["levels"].values():  # the figures are the median (lower middle) run's
        for system in ("ours", "baseline_static"):
            runs = level[system + "_runs_audio_s_per_s"]
            assert len(runs) == 2 and level[system]["throughput_audio_s_per_s"] == min(runs)
        assert len(level["throughput_ratio_runs"]) == 2 and all(r > 0 for r in level["throughput_ratio_runs"])
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "concurrency 8" in run.stdout
    assert_machine_and_dtypes(report)
    assert report["ours"]["dtype"] == report["dtypes"]["ours"]["dtype"]
    assert report["baseline"]["dtype"] == report["dtypes"]["baseline"]["dtype"]  # transformers' faster one, timed
    assert set(report["baseline"]["calibration_s_24_tokens_b4"]) == {"float32", "bfloat16"}
    assert "machine: " in run.stdout and f"ours {report['ours']['dtype']} (auto: " in run.stdout
