"""tools/thread_slowdown_repro.py stays runnable, and its two ends still differ where they should:
a plain helper thread builds an OpenMP team of its own (one more OS thread than itself), a
thread beside the runtime's device thread does not. Counts, not timings (those swing here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "thread_slowdown_repro.py"


@pytest.mark.slow
def test_plain_threads_build_a_team_and_the_runtimes_do_not(tmp_path):
    out = tmp_path / "repro.json"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--variants", "default,mstar", "--rounds", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads(out.read_text())
    plain, runtime = results["default"], results["mstar"]
    assert plain["helper_width"] == 2 and plain["threads_b"] - plain["threads_a"] == 2  # helper + its worker
    assert runtime["helper_width"] == 1 and runtime["threads_b"] - runtime["threads_a"] == 1  # the helper only
    assert plain["device_width"] == runtime["device_width"] == 2
    for r in (plain, runtime):
        assert r["b_over_a"] > 0 and r["main_over_a"] > 0
    assert "B/A" in run.stdout and "mstar" in run.stdout
