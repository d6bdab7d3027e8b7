"""tools/probe_control_plane.py measures each case against the real Worker and WorkerPool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).parents[2] / "tools" / "probe_control_plane.py"


@pytest.mark.slow
def test_announced_frames_cost_nothing_and_silent_peers_make_two_lines_with_a_reason(tmp_path):
    out_json = tmp_path / "probe.json"
    out = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--connections",
            "30",
            "--hello-timeout",
            "0.3",
            "--wait",
            "1",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out_json.read_text())
    assert r["worker-announced-1gib"]["rss_growth_mb"] < 100 and r["worker-announced-1gib"]["exit_status"] == 2
    assert r["worker-announced-over-limit"]["exit_status"] == 2
    assert "over the 1073741824-byte limit" in r["worker-announced-over-limit"]["stderr"]
    assert r["conductor-announced-1gib"]["rss_growth_mb"] < 100
    silent = r["silent-connections"]
    assert silent["warning_lines"] == 2 and silent["lines_without_a_reason"] == 0, silent
    assert silent["last_line"].endswith("it sent no Hello within 0.3s (28 more like this in the last 5.0 s)"), silent
