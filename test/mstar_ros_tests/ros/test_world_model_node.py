"""The V-JEPA 2-AC node set over real DDS, driven by a world-model bag: the session's KV grows then stays
within its window, a goal image leads to published plans, bad input is reported and dropped."""
from __future__ import annotations

import json
import math
import sys
import time

import pytest

from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag
from mstar_ros.launch_spec import vjepa2_processes

WINDOW = 4
HORIZON = 2


@pytest.fixture(scope="module")
def wm_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("wm_bag") / "wm"
    write_end_effector_bag(path, EndEffectorBagSpec(robots=1, seconds=6.0, seed=1, width=64, height=64))
    return path


def _values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@pytest.mark.timeout(150)
def test_world_model_session_plans_toward_a_goal_and_drops_bad_input(procs, start_player, wm_bag, ros_client,
                                                                      tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import PoseStamped
    from nav_msgs.msg import Path
    from sensor_msgs.msg import Image
    from std_msgs.msg import Float64

    for msg_type, topic in ((PoseStamped, "/robot1/plan/target_pose"), (Path, "/robot1/plan/path"),
                            (Float64, "/robot1/plan/energy"), (Float64, "/robot1/plan/gripper"),
                            (DiagnosticArray, "/diagnostics")):
        ros_client.subscribe(msg_type, topic, depth=200)
    summary_path = tmp_path / "summary.json"
    (spec,) = vjepa2_processes("/robot1", extra_arguments=["--duration", "120", "--summary-json", str(summary_path)],
                               ros_arguments=["-p", f"window_frames:={WINDOW}", "-p", f"plan_horizon:={HORIZON}",
                                              "-p", "plan_samples:=8", "-p", "plan_topk:=4", "-p", "plan_iterations:=2",
                                              "-p", "report_period_s:=0.0"])
    node_set = procs(*spec.command(python=sys.executable))
    goal_pub = ros_client.publisher(Image, "/robot1/goal_image")
    camera_pub = ros_client.publisher(Image, "/robot1/camera/exterior/image_raw")
    pose_pub = ros_client.publisher(PoseStamped, "/robot1/ee_pose")
    ros_client.wait_for(lambda: goal_pub.get_subscription_count() > 0 and camera_pub.get_subscription_count() > 0,
                        60, "the world-model node's subscriptions", [node_set])

    def image(encoding: str = "rgb8", size: int = 64) -> Image:
        msg = Image(encoding=encoding, width=size, height=size, step=size * 3)
        msg.header.stamp = ros_client.node.get_clock().now().to_msg()
        msg.data = bytes(range(256)) * (size * size * 3 // 256)
        return msg

    time.sleep(0.5)  # the subscriber's side of discovery completes a little after the publisher's
    goal_pub.publish(image())  # before any frame: reported and dropped
    # the node reads the camera, the pose and the gripper (not the recorded actions: it derives them)
    player = start_player(wm_bag, "--topics", "/robot1/camera", "/robot1/ee_pose", "/robot1/gripper")

    def node_status():
        for got in reversed(ros_client.got("/diagnostics")):
            for status in got.msg.status:
                if status.name == "mstar: /robot1/world_model":
                    return _values(status), status
        return None, None

    ros_client.wait_for(lambda: int((node_status()[0] or {}).get("frames", "0")) >= 3, 60, "3 frames in the session",
                        [node_set, player])
    bad_image = image(encoding="16UC1")
    bad_image.step = 64 * 2
    bad_image.data = bytes(64 * 64 * 2)
    camera_pub.publish(bad_image)
    nan_pose = PoseStamped()
    nan_pose.header.stamp = ros_client.node.get_clock().now().to_msg()
    nan_pose.pose.position.x = float("nan")
    nan_pose.pose.orientation.w = 1.0
    pose_pub.publish(nan_pose)
    goal_pub.publish(image())
    ros_client.wait_for(lambda: len(ros_client.got("/robot1/plan/path")) >= 3, 90, "3 plans", [node_set, player])

    def engine_counters():
        out = []
        for got in ros_client.got("/diagnostics"):
            for status in got.msg.status:
                values = _values(status)
                if "worker0.ar:predictor.context_blocks" in values:
                    out.append((int(values["worker0.ar:predictor.context_blocks"]),
                                int(values["worker0.ar:predictor.window_slides"])))
        return out

    ros_client.wait_for(lambda: any(slides >= 2 for _, slides in engine_counters()), 60, "the window to slide twice",
                        [node_set, player])
    assert node_set.interrupt() == 0, node_set.output
    player.interrupt()

    paths = [g.msg for g in ros_client.got("/robot1/plan/path")]
    assert all(len(p.poses) == HORIZON for p in paths)
    targets = [g.msg for g in ros_client.got("/robot1/plan/target_pose")]
    assert len(targets) >= 3 and all(t.header.frame_id == "robot1/base_link" for t in targets)
    for t, p in zip(targets, paths):
        assert t.pose.position.x == p.poses[0].pose.position.x
        q = t.pose.orientation
        assert abs(math.sqrt(q.x ** 2 + q.y ** 2 + q.z ** 2 + q.w ** 2) - 1) < 1e-6
    energies = [g.msg.data for g in ros_client.got("/robot1/plan/energy")]
    assert energies and all(math.isfinite(e) and e > 0 for e in energies)
    assert all(0.0 <= g.msg.data <= 1.0 for g in ros_client.got("/robot1/plan/gripper"))

    # the session's KV grew frame by frame, then stayed within the window (the pending frame is not in it)
    blocks = [b for b, _ in engine_counters()]
    assert max(blocks) <= WINDOW - 1, blocks
    assert any(later > earlier for earlier, later in zip(blocks, blocks[1:])), blocks

    whole = json.loads(summary_path.read_text())
    from mstar.engine.dtype_choice import resolve_dtype
    assert whole["dtype"] == resolve_dtype("auto").describe()  # decided by the Worker, with its reason
    summary = whole["robots"]["/robot1"]
    assert summary["plans"] >= 3 and summary["goals"] == 1 and summary["frames"] >= 5, summary
    assert summary["dropped"] >= 3, node_set.output
    assert summary["frames_failed"] == 0 and summary["plans_failed"] == 0, summary
    out = node_set.output
    assert "a goal before any frame" in out and "16UC1" in out and "NaN" in out, out


@pytest.mark.timeout(60)
def test_parameters_that_cannot_work_exit_2_naming_the_parameter(procs):
    (spec,) = vjepa2_processes("/robot1", ros_arguments=["-p", "plan_samples:=4", "-p", "plan_topk:=8"])
    node_set = procs(*spec.command(python=sys.executable))
    assert node_set.proc.wait(timeout=50) == 2, node_set.output
    node_set._reader.join(timeout=5)
    assert "parameter plan_topk: 8 is more than plan_samples=4" in node_set.output
    assert "Traceback" not in node_set.output
