"""`mstar-ros demo` (what `make demo` runs): node set + bag player, then what was served."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mstar_ros.bag.bundled import BAG_SECONDS, bundled_bag


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_demo_serves_two_robots_and_prints_rates_latencies_and_joints(short_bag, ros_env, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "demo",
            "--seconds",
            "6",
            "--bag",
            str(short_bag),
            "--logs",
            str(tmp_path / "logs"),
        ],
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "DDS on 127.0.0.1 only" in text
    assert "pi0.5 node set served 2 robots" in text and "RANDOM weights" in text
    assert "action chunks per second, all robots:" in text
    for ns in ("/robot1", "/robot2"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{ns}/action_chunk:"))
        assert "chunks/s" in line and "latency p50" in line and "p95" in line and " 0 chunks," not in line, line
    assert text.count("joints: panda_joint1, panda_joint2") == 2 and "robotiq_85_left_knuckle_joint" in text
    assert (tmp_path / "logs" / "node_set.log").read_text().count("served") == 1


def test_the_bundled_bag_is_made_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("MSTAR_CACHE", str(tmp_path))
    first = bundled_bag()
    stamp = (first / "metadata.yaml").stat().st_mtime_ns
    assert bundled_bag() == first and (first / "metadata.yaml").stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "bags" and f"{BAG_SECONDS:g}s" in first.name
