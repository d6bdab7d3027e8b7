"""tools/world_model_flood.py in its quick form: two world-model robots over real DDS, robot 2's camera flooded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mstar_ros.bag.ros_env import apply_localhost_defaults
from support.ros_domain import next_domain

TOOL = Path(__file__).parents[2] / "tools" / "world_model_flood.py"


@pytest.mark.timeout(300)
@pytest.mark.ros
@pytest.mark.slow
def test_robot1_plans_per_second_are_measured_quiet_and_with_robot2_flooded(tmp_path, monkeypatch):
    monkeypatch.setenv("ROS_DOMAIN_ID", str(next_domain()))
    apply_localhost_defaults()
    out_json = tmp_path / "flood.json"
    run = subprocess.run(
        [sys.executable, str(TOOL), "--seconds", "2", "--warmup", "1", "--rate", "300", "--json", str(out_json)],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out_json.read_text())
    rates = result["robot1_plans_per_s"]
    assert rates["quiet"] > 0 and rates["flood"] > 0, result
    assert result["flood_guard"] and result["flood_frames_sent"] > 500  # 300/s over two 2 s windows
    robot2 = result["robots"]["/robot2"]
    assert robot2["topics_shut"] >= 1 and robot2["dropped"] < result["flood_frames_sent"] / 2, robot2
    assert "flood guard on: robot 1 plans/s quiet" in run.stdout
