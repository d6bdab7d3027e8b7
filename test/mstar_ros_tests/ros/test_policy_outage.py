"""The pi0.5 policy node when its policy cannot produce chunks, over real DDS with real Worker processes:
a Worker killed (SIGKILL) or stalled (SIGSTOP) holds the robot (an empty JointTrajectory) and makes
its status ERROR until chunks come again, as a sensor loss does."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from mstar_ros.launch_spec import default_params_file, pi05_processes

CONFIG = yaml.safe_load(default_params_file().read_text())["/**"]["ros__parameters"]
JOINTS = CONFIG["joint_names"]
CAMERAS = list(CONFIG["cameras"].values())
MIDDLE = [(a + b) / 2 for a, b in zip(CONFIG["joint_lower"], CONFIG["joint_upper"])]
PLACEMENT = Path(__file__).parents[3] / "config" / "placement" / "pi05-two-ranks.yaml"
POLICY = "mstar: /robot1/pi05_policy"
RANK1 = "mstar: conductor: worker rank 1"
TOPIC = "/robot1/action_chunk"
# limits the random tiny weights' actions stay inside: no WARN about them among the statuses watched
WIDE = ["-p", f"joint_lower:={[-100.0] * len(JOINTS)}", "-p", f"joint_upper:={[100.0] * len(JOINTS)}"]


def _statuses(client, name: str, since: float = 0.0) -> list:
    return [s for g in client.got("/diagnostics") if g.arrival >= since for s in g.msg.status if s.name == name]


def _timed(client, name: str, since: float = 0.0) -> list[tuple[float, object]]:
    """(arrival, status) of each status named ``name``."""
    return [
        (g.arrival, s) for g in client.got("/diagnostics") if g.arrival >= since for s in g.msg.status if s.name == name
    ]


def _stamp(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def _chunks(client, since: float = 0.0, empty: bool = False) -> list:
    return [g for g in client.got(TOPIC) if g.arrival >= since and (len(g.msg.points) == 0) == empty]


def _start(procs, ros_client, robot_feed, tmp_path, ros_arguments=()):
    from diagnostic_msgs.msg import DiagnosticArray
    from trajectory_msgs.msg import JointTrajectory

    ros_client.subscribe(JointTrajectory, TOPIC)
    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=1000)
    summary = tmp_path / "summary.json"
    (spec,) = pi05_processes(
        "/robot1",
        placement=str(PLACEMENT),
        ros_arguments=WIDE + list(ros_arguments),
        extra_arguments=["--duration", "170", "--summary-json", str(summary)],
    )
    node_set = procs(*spec.command(python=sys.executable))
    robot_feed("/robot1", CAMERAS, JOINTS, positions=MIDDLE).start()
    ros_client.wait_for(lambda: len(_chunks(ros_client)) >= 2, 120, "two chunks", [node_set])
    return node_set, summary


def _rank1_pid(ros_client) -> int:
    last = _statuses(ros_client, RANK1)[-1]
    return int({kv.key: kv.value for kv in last.values}["pid"])


def _held_then_error(ros_client, node_set, since: float, why: str) -> object:
    """The stop (an empty JointTrajectory of the joints) and ERROR saying ``why``; returns the stop."""
    ros_client.wait_for(lambda: _chunks(ros_client, since, empty=True), 10, "the stop", [node_set])
    stop = _chunks(ros_client, since, empty=True)[0]
    assert list(stop.msg.joint_names) == JOINTS and stop.msg.points == []
    ros_client.wait_for(
        lambda: any(s.level == s.ERROR and why in s.message for s in _statuses(ros_client, POLICY, since)),
        5,
        f"ERROR: {why}",
        [node_set],
    )
    return stop


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_killed_worker_holds_the_robot_and_says_error_until_chunks_resume(procs, ros_client, robot_feed, tmp_path):
    node_set, summary = _start(procs, ros_client, robot_feed, tmp_path)
    killed = time.monotonic()
    os.kill(_rank1_pid(ros_client), signal.SIGKILL)
    stop = _held_then_error(ros_client, node_set, killed, "worker rank 1")
    assert stop.arrival - killed < 2.0, stop.arrival - killed  # seen within a tick or two, not at a failed chunk
    # ERROR once a second while the rank is down, and no chunk: nothing can compute one
    ros_client.wait_for(
        lambda: any(s.level == s.ERROR for _, s in _timed(ros_client, RANK1, killed)), 10, "rank 1 down", [node_set]
    )
    down_at = next(t for t, s in _timed(ros_client, RANK1, killed) if s.level == s.ERROR)
    ros_client.wait_for(
        lambda: any(s.level == s.OK for _, s in _timed(ros_client, RANK1, down_at)), 120, "rank 1 back", [node_set]
    )
    back_at = next(t for t, s in _timed(ros_client, RANK1, down_at) if s.level == s.OK)
    assert all(g.arrival > back_at - 0.5 for g in _chunks(ros_client, stop.arrival)), "a chunk while rank 1 was down"
    held = _stamp(stop.msg)  # by publication (arrivals on two topics may cross): statuses said after the hold
    during = [
        s
        for g in ros_client.got("/diagnostics")
        if _stamp(g.msg) >= held and g.arrival < back_at
        for s in g.msg.status
        if s.name == POLICY
    ]
    # the rank's own OK comes from the Conductor's node, and may arrive after the robot's first chunk (and its
    # "resumed") did: the robot's statuses count up to that
    resumed = next((i for i, s in enumerate(during) if "resumed" in s.message), len(during))
    during = during[:resumed]
    assert during, "no status of the robot while rank 1 was down"
    assert all(s.level == s.ERROR for s in during), [(s.level, s.message) for s in during if s.level != s.ERROR]
    ros_client.wait_for(lambda: _chunks(ros_client, back_at - 0.5), 60, "chunks after rank 1 came back", [node_set])
    ros_client.wait_for(
        lambda: any(s.level == s.OK and "resumed" in s.message for s in _statuses(ros_client, POLICY, stop.arrival)),
        10,
        "OK: resumed",
        [node_set],
    )
    assert node_set.interrupt() == 0, node_set.output
    r = json.loads(summary.read_text())["robots"]["/robot1"]

    assert r["policy_outages"] == 1 and r["stops_published"] == 1 and r["sensor_losses"] == 0, r


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_a_stalled_worker_makes_the_chunk_overdue_holds_and_resumes(procs, ros_client, robot_feed, tmp_path):
    """SIGSTOP: the Worker is alive (its heartbeat has 5 s) but computes nothing; the chunk is overdue after
    chunk_timeout_s, the robot holds, and chunks resume once it runs again."""
    node_set, summary = _start(procs, ros_client, robot_feed, tmp_path, ["-p", "chunk_timeout_s:=1.5"])
    pid = _rank1_pid(ros_client)
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        stop = _held_then_error(ros_client, node_set, stopped, "overdue")
        assert stop.arrival - stopped < 1.5 + 25 / 15 + 1.0  # requested within a refill period, then 1.5 s
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    ros_client.wait_for(lambda: _chunks(ros_client, resumed), 30, "chunks after SIGCONT", [node_set])
    ros_client.wait_for(
        lambda: any(s.level == s.OK and "resumed" in s.message for s in _statuses(ros_client, POLICY, resumed)),
        10,
        "OK: resumed",
        [node_set],
    )
    assert node_set.interrupt() == 0, node_set.output
    r = json.loads(summary.read_text())["robots"]["/robot1"]

    assert r["policy_outages"] >= 1 and r["chunks_overdue"] >= 1 and r["sensor_losses"] == 0, r
