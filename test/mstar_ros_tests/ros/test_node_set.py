"""The pi0.5 node set over real DDS: a bag-player process, the node set process, this test's rclpy client.

The node set is started from mstar_ros.launch_spec (what `mstar-ros launch pi05` and
`ros2 launch mstar_ros pi05.launch.py` start), with config/pi05.yaml.
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np
import pytest
import yaml

from mstar_ros.launch_spec import default_params_file, pi05_processes

CONFIG = yaml.safe_load(default_params_file().read_text())["/**"]["ros__parameters"]
JOINTS = CONFIG["joint_names"]
RATE = CONFIG["control_rate_hz"]


def start_node_set(procs, tmp_path, robots: str, max_inflight: str = "0"):
    summary = tmp_path / "summary.json"
    (spec,) = pi05_processes(
        robots, max_inflight=max_inflight, extra_arguments=["--duration", "120", "--summary-json", str(summary)]
    )
    return procs(*spec.command(python=sys.executable)), summary


def seconds(duration) -> float:
    return duration.sec + duration.nanosec * 1e-9


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_two_robots_get_chunks_with_the_configured_joints_horizon_and_rate(
    procs, start_player, short_bag, ros_client, tmp_path
):
    from trajectory_msgs.msg import JointTrajectory

    topics = ["/robot1/action_chunk", "/robot2/action_chunk"]
    for topic in topics:
        ros_client.subscribe(JointTrajectory, topic)
    # one chunk in flight at a time: the robots take turns, neither starves
    node_set, summary_path = start_node_set(procs, tmp_path, "/robot1 /robot2", max_inflight="1")
    player = start_player(short_bag)
    ros_client.wait_for(
        lambda: all(len(ros_client.got(t)) >= 3 for t in topics),
        90,
        "3 chunks on each robot's action_chunk",
        [node_set, player],
    )
    assert node_set.interrupt() == 0, node_set.output
    player.interrupt()

    summary = json.loads(summary_path.read_text())
    assert summary["max_inflight"] == 1 and summary["peak_in_flight"] == 1  # never two chunks at once
    for topic in topics:
        ns, outside = topic.rsplit("/", 1)[0], 0
        horizon = summary["robots"][ns]["horizon"]
        assert horizon == 50  # the generated checkpoint's action_horizon, as the released model's
        chunks = [g.msg for g in ros_client.got(topic)]
        stamps = [seconds(c.header.stamp) for c in chunks]
        assert stamps == sorted(stamps), f"{topic}: chunks out of order"
        for chunk in chunks:
            assert list(chunk.joint_names) == JOINTS
            # the actions whose time passed while the chunk was computed are skipped: a few at most
            assert horizon - 15 <= len(chunk.points) <= horizon, len(chunk.points)
            t = np.array([seconds(p.time_from_start) for p in chunk.points])
            assert t[0] == 0.0 and np.allclose(np.diff(t), 1.0 / RATE, atol=1e-6), t[:4]
            pos = np.array([list(p.positions) for p in chunk.points])
            assert pos.shape == (len(chunk.points), len(JOINTS)) and np.isfinite(pos).all()
            outside += bool(((pos < CONFIG["joint_lower"]) | (pos > CONFIG["joint_upper"])).any())
        r = summary["robots"][ns]
        # RANDOM weights leave the limits: that is reported (counted), never clamped
        assert (r["chunks_outside_limits"] > 0) == (outside > 0), (r["chunks_outside_limits"], outside)
        assert r["states_outside_limits"] == 0  # the bag's joints stay inside
        assert r["chunks"] >= 3 and r["joint_names"] == JOINTS and r["rate_hz"] == RATE
        assert r["latency_p50_ms"] is not None and r["dropped_frames"] == 0, r
        # how many requests waited (timing-dependent, so only bounded here): at most one per request sent
        assert 0 <= r["fresh_waits"] <= r["chunks"] + 1 and 0 <= r["admission_waits"] <= r["chunks"] + 1, r
    assert "served" in node_set.output and "sensor-to-action p50" in node_set.output


def _image(encoding: str, width: int, height: int, step: int | None = None, channels: int = 3):
    from sensor_msgs.msg import Image

    msg = Image(encoding=encoding, width=width, height=height, step=step if step is not None else width * channels)
    msg.data = bytes(msg.step * height)
    return msg


def _joints(names, positions):
    from sensor_msgs.msg import JointState

    return JointState(name=list(names), position=[float(x) for x in positions])


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_bad_input_is_reported_and_dropped_while_the_other_robot_is_served(
    procs, start_player, short_bag, ros_client, tmp_path
):
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String
    from trajectory_msgs.msg import JointTrajectory

    ros_client.subscribe(JointTrajectory, "/robot1/action_chunk")
    ros_client.subscribe(JointTrajectory, "/robot2/action_chunk")
    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=1000)
    node_set, summary_path = start_node_set(procs, tmp_path, "/robot1 /robot2")
    player = start_player(short_bag, "--topics", "/robot1")  # /robot2 gets only what this test sends
    ros_client.wait_for(lambda: ros_client.got("/robot1/action_chunk"), 90, "robot1's first chunk", [node_set, player])

    ext = ros_client.publisher(Image, "/robot2/camera/exterior/image_raw")
    wrist = ros_client.publisher(Image, "/robot2/camera/wrist/image_raw")
    joints = ros_client.publisher(JointState, "/robot2/joint_states")
    prompt = ros_client.publisher(String, "/robot2/prompt")
    nan_state = [0.0] * len(JOINTS)
    nan_state[2] = math.nan
    bad = [  # (publisher, message, what the diagnostic must say)
        (
            ext,
            _image("rgba8", 224, 224, channels=4),
            "/robot2/camera/exterior/image_raw: image encoding 'rgba8' is not supported",
        ),
        (
            ext,
            _image("rgb8", 100, 80),
            "/robot2/camera/exterior/image_raw: image is 100x80, this camera is configured for 224x224",
        ),
        (
            wrist,
            _image("rgb8", 224, 224, step=300),
            "/robot2/camera/wrist/image_raw: step 300 is less than width x channels = 672",
        ),
        (joints, _joints([], [0.1] * 7), "/robot2/joint_states: 7 positions without names, expected 8"),
        (
            joints,
            _joints(JOINTS[:7], [0.1] * 7),
            "/robot2/joint_states: joint state lacks joints ['robotiq_85_left_knuckle_joint']",
        ),
        (
            joints,
            _joints(JOINTS, nan_state),
            "/robot2/joint_states: joint state has NaN or infinite positions for ['panda_joint3']",
        ),
        (prompt, String(data="   "), "/robot2/prompt: empty prompt ignored"),
    ]
    ros_client.wait_for(
        lambda: all(p.get_subscription_count() > 0 for p, _, _ in bad), 30, "the node's subscriptions", [node_set]
    )

    def robot2_errors() -> list:
        return [
            s
            for g in ros_client.got("/diagnostics")
            for s in g.msg.status
            if s.hardware_id == "/robot2" and s.level == s.ERROR
        ]

    def reported(text: str) -> bool:
        return any(text in s.message for s in robot2_errors())

    # keep sending the bad inputs for a while (also until each is seen: best-effort subscriptions
    # may miss the first ones just after discovery); robot1 must keep being served meanwhile
    start = time.monotonic()
    while time.monotonic() - start < 4.0 or not all(reported(text) for _, _, text in bad):
        assert time.monotonic() - start < 30, f"not reported: {[t for _, _, t in bad if not reported(t)]}"
        for pub, msg, _ in bad:
            pub.publish(msg)
        time.sleep(0.2)
    end = time.monotonic()
    robot1_during = [g for g in ros_client.got("/robot1/action_chunk") if start <= g.arrival <= end]
    assert len(robot1_during) >= 2, f"robot1 got {len(robot1_during)} chunks in {end - start:.1f} s of bad input"

    errors = robot2_errors()
    assert all(s.name == "mstar: /robot2/pi05_policy" for s in errors)
    counters = [dict((kv.key, kv.value) for kv in s.values) for s in errors]
    assert max(int(c["dropped"]) for c in counters) >= len(bad) - 1  # bad messages; the prompt is counted apart
    assert max(int(c["prompts_refused"]) for c in counters) >= 1
    assert node_set.interrupt() == 0, node_set.output
    player.interrupt()
    assert ros_client.got("/robot2/action_chunk") == []  # every frame it got was dropped: nothing to act on
    summary = json.loads(summary_path.read_text())
    r2 = summary["robots"]["/robot2"]
    assert r2["chunks"] == 0 and r2["dropped_frames"] >= len(bad) - 1 and r2["prompts_refused"] >= 1
    assert summary["robots"]["/robot1"]["chunks"] >= 3 and summary["robots"]["/robot1"]["dropped_frames"] == 0
    assert summary["max_inflight"] == 0 and summary["peak_in_flight"] == 1  # no limit; only /robot1 sent any


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_with_a_placement_every_worker_process_reports_on_diagnostics(
    procs, start_player, short_bag, ros_client, tmp_path
):
    from pathlib import Path

    from diagnostic_msgs.msg import DiagnosticArray
    from trajectory_msgs.msg import JointTrajectory

    placement = Path(__file__).parents[3] / "config" / "placement" / "pi05-two-ranks.yaml"
    ros_client.subscribe(DiagnosticArray, "/diagnostics")
    ros_client.subscribe(JointTrajectory, "/robot1/action_chunk")
    (spec,) = pi05_processes("/robot1", placement=str(placement), extra_arguments=["--duration", "120"])
    node_set = procs(*spec.command(python=sys.executable))
    player = start_player(short_bag, "--topics", "/robot1")

    def names() -> set[str]:
        return {s.name for g in ros_client.got("/diagnostics") for s in g.msg.status}

    ros_client.wait_for(
        lambda: (
            {"mstar: worker 0", "mstar: worker 1", "mstar: conductor"} <= names()
            and len(ros_client.got("/robot1/action_chunk")) >= 2
        ),
        120,
        "diagnostics from both Worker processes and the Conductor, and chunks",
        [node_set, player],
    )
    status = next(s for g in ros_client.got("/diagnostics") for s in g.msg.status if s.name == "mstar: worker 0")
    assert {v.key for v in status.values} >= {"nodes", "kv_blocks_used"}
    assert node_set.interrupt() == 0, node_set.output
    player.interrupt()
