"""A bag replayed with its recorded stamps (from 2024), as `ros2 bag play` replays it, into the pi0.5 node set.

By the node's system clock every frame is old: refused as stale, no chunk. With use_sim_time
(`mstar-ros launch pi05 --use-sim-time`, from mstar_ros.launch_spec) and `bag play --clock` the node
keeps the recording's time: the same frames are current and the robot gets chunks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mstar_ros.bag.synthetic import SyntheticBagSpec, write_synthetic_bag
from mstar_ros.launch_spec import pi05_processes

CHUNKS = "/robot1/action_chunk"


@pytest.fixture(scope="module")
def recorded_bag(tmp_path_factory) -> Path:
    """One robot, 6 s, stamped as recorded in 2024."""
    path = tmp_path_factory.mktemp("sim_time") / "droid_6s"
    write_synthetic_bag(path, SyntheticBagSpec(robots=1, seconds=6.0, seed=5))
    return path


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sim_time", [True, False], ids=["use_sim_time and --clock", "system clock"])
@pytest.mark.slow
def test_recorded_stamps_are_served_on_sim_time_and_refused_as_stale_without(
    sim_time, recorded_bag, procs, ros_client, tmp_path
):
    from trajectory_msgs.msg import JointTrajectory

    ros_client.subscribe(JointTrajectory, CHUNKS)
    summary_path = tmp_path / "summary.json"
    (spec,) = pi05_processes(
        "/robot1",
        use_sim_time=str(sim_time).lower(),
        extra_arguments=["--duration", "150", "--summary-json", str(summary_path)],
    )
    node_set = procs(*spec.command(python=sys.executable))
    player = procs(
        sys.executable,
        "-m",
        "mstar_ros.cli",
        "bag",
        "play",
        str(recorded_bag),
        "--progress",
        "0",
        "--wait-timeout",
        "90",
        *(["--clock"] if sim_time else []),
    )
    assert player.proc.wait(timeout=150) == 0, player.output + "\n" + node_set.output  # the whole bag, once
    assert node_set.interrupt() == 0, node_set.output
    robot = json.loads(summary_path.read_text())["robots"]["/robot1"]
    chunks = ros_client.got(CHUNKS)
    if sim_time:
        assert "/clock" in player.output
        assert robot["stale_frames"] == 0 and robot["chunks"] >= 2 and len(chunks) >= 2, (robot, node_set.output)
        # a chunk is stamped on the node's clock: the recording's time
        stamp = chunks[0].msg.header.stamp
        assert 1_714_521_600 <= stamp.sec <= 1_714_521_600 + 11, stamp
    else:
        assert robot["chunks"] == 0 and chunks == [], robot
        assert robot["stale_frames"] > 100, robot  # each camera frame and joint state, refused and counted
        assert "over max_observation_age_s" in node_set.output  # said (throttled), with the way out
