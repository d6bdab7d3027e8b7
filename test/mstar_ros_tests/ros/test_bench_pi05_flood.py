"""``mstar-ros bench pi05 --flood`` in its quick form: the node set over real DDS, robot 2 flooded with bad frames."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_flood_bench_reports_robot1_latency_with_and_without_robot2s_flood(ros_env, tmp_path):
    out = tmp_path / "flood.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "pi05",
            "--flood",
            "--preset",
            "tiny",
            "--seconds",
            "3",
            "--flood-warmup",
            "2",
            "--flood-rate",
            "200",
            "--json",
            str(out),
        ],
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=230,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    for kind in ("quiet", "flood"):
        assert result["robot1"][kind]["chunks"] >= 1 and result["robot1"][kind]["p50_ms"] > 0
    assert result["robot1_p50_ratio"] > 0 and result["robot1_p95_ratio"] > 0
    assert result["flood_frames_sent"] > 500  # 200/s over two 3 s windows
    assert 0 < result["robot2_dropped_frames"] <= result["flood_frames_sent"]  # received, counted, dropped
    assert result["robot1_dropped_frames"] == 0
    assert "node_set_cpu_us_per_bad_frame" in result
    assert "robot1_p50_ratio" in run.stdout and "(goal <= 1.15)" in run.stdout
