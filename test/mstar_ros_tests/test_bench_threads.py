"""``mstar-ros bench threads`` in quick form (tiny checkpoint, 2 rounds).

The timing ratio is reported, not bounded here (--max-ratio 1000: timings on a shared 2-core
machine swing 2-4x); the check's structural half is asserted: no thread but the device thread
built an OpenMP team. OMP_NUM_THREADS=2 so teams would form on any machine."""

import json
import os
import subprocess
import sys

import pytest


def bench_threads(tmp_path, *extra):
    out = tmp_path / "threads.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_NUM_THREADS"] = "2"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "threads",
            "--preset",
            "tiny",
            "--rounds",
            "2",
            "--max-ratio",
            "1000",
            "--json",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return run, json.loads(out.read_text()) if out.exists() else None


def test_other_threads_torch_work_builds_no_team_and_the_ratio_is_reported(tmp_path):
    run, report = bench_threads(tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert report["ok"] is True
    assert report["device_threads"] == 2 and report["helper_width"] == 1 and report["main_width"] == 1
    assert report["helper_threads_added"] == 1  # the helper itself, no OpenMP worker of its own
    assert report["main_threads_added"] == 0
    assert report["thread_slowdown_ratio"] > 0 and report["after_main_ratio"] > 0
    for key in ("fresh_ms", "a_ms", "b_ms", "after_main_ms"):
        assert report[key] > 0, key
    assert "thread_slowdown_ratio B/A" in run.stdout
    assert report["dtype_choice"]["requested"] == "auto" and report["dtype"] == report["dtype_choice"]["dtype"]
    assert report["machine"]["cpu_capability"]


@pytest.mark.slow
def test_the_check_fails_when_another_thread_builds_a_team(tmp_path):
    run, report = bench_threads(tmp_path, "--helper-threads", "2")  # as a library calling torch.set_num_threads(2)
    assert run.returncode == 1, run.stderr[-2000:]
    assert report["ok"] is False and report["helper_width"] == 2
    assert report["helper_threads_added"] == 2  # the helper and its team's worker
    assert "FAILED" in run.stdout
