"""``mstar-ros bench pi05`` runs end to end (a smoke run on the tiny checkpoint: figures are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.bench_reports import assert_machine_and_dtypes


@pytest.mark.slow
def test_bench_pi05_writes_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "p.json", tmp_path / "p.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "pi05",
            "--preset",
            "tiny",
            "--robots",
            "1,2",
            "--seconds",
            "0.6",
            "--max-inflight",
            "1",
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
    for key in ("throughput_ratio_2_robots", "overhead_ratio_1_robot", "overhead_ratio_closed_loop"):
        assert report[key] > 0, key
    assert report["ours"]["max_inflight"] == 1  # robots take turns: the node set's --max-inflight
    assert report["workload"]["frame_policy"].startswith("fresh:")  # the policy node's default, both systems
    assert report["model"]["random_weights"] is True and report["model"]["dtype"] in ("float32", "bfloat16")
    for n in ("1", "2"):
        level = report["levels"][n]
        for system in ("ours", "baseline"):
            closed, open_ = level[system]["closed_loop"], level[system]["open_loop"]
            assert closed["chunks"] >= int(n) and closed["chunks_per_s"] > 0
            assert open_["served"] >= 1 and open_["offered"] == open_["served"] + open_["dropped"]
            assert 0 < open_["latency_p50_ms"] <= open_["latency_p95_ms"]
        assert level["baseline"]["bare_forward_p50_ms"] > 0 and level["throughput_ratio"] > 0
    bound = report["batching_bound"]  # a direct call is the prefix pass plus vision and the flow steps
    assert 0 < bound["prefix_pass_ms"] < bound["direct_forward_ms"] and bound["throughput_ratio_bound"] > 1
    assert "no batching can beat" in run.stdout
    check = report["thread_slowdown"]  # issue 16's guard, in a fresh child on the same checkpoint and dtype
    assert report["thread_slowdown_ratio"] == check["thread_slowdown_ratio"] > 0
    assert check["preset"] == "tiny" and check["dtype"] == report["model"]["dtype"]
    assert check["helper_threads_added"] <= 1 and check["main_threads_added"] == 0  # no OpenMP team but the device's
    assert "thread_slowdown_ratio B/A" in run.stdout
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 robot(s)" in run.stdout
    assert_machine_and_dtypes(report)
    assert report["model"]["dtype"] == report["dtypes"]["ours"]["dtype"] == report["dtypes"]["baseline"]["dtype"]
    assert set(report["dtypes"]["timed_now_s"]) == {"float32", "bfloat16"}  # both timed beside the choice
