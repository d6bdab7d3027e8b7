"""The BAGEL node set over real DDS (tiny RANDOM checkpoint): a question about the camera's latest frame is
answered, an instruction edits that frame into a goal image stamped as its source, bad input is logged naming
its field and the node keeps serving; and beside the V-JEPA 2-AC node set, driven by a world-model bag, the
goal image BAGEL imagines ("the cup in the drawer") is what the world model plans toward."""

from __future__ import annotations

import json
import sys
import time

import pytest

from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag
from mstar_ros.launch_spec_bagel import bagel_processes, bagel_vjepa2_processes

FAST_BAGEL = ["-p", "edit_steps:=3", "-p", "max_answer_tokens:=6", "-p", "report_period_s:=0.0"]


def _status(ros_client, name: str) -> dict[str, str]:
    for got in reversed(ros_client.got("/diagnostics")):
        for status in got.msg.status:
            if status.name == name:
                return {kv.key: kv.value for kv in status.values}
    return {}


def _count(ros_client, name: str, key: str) -> int:
    return int(_status(ros_client, name).get(key, "0"))


def _image(encoding: str, width: int, height: int, channels: int, stamp, frame_id: str = "cam"):
    from sensor_msgs.msg import Image

    msg = Image(encoding=encoding, width=width, height=height, step=width * channels)
    msg.header.stamp, msg.header.frame_id = stamp, frame_id
    msg.data = bytes((7 * i) % 256 for i in range(width * height * channels))
    return msg


@pytest.mark.timeout(90)
def test_bagel_node_answers_edits_the_latest_frame_and_refuses_bad_input(procs, ros_client, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=200)
    ros_client.subscribe(String, "/robot1/bagel/answer")
    ros_client.subscribe(Image, "/robot1/goal_image")
    summary_path = tmp_path / "summary.json"
    (spec,) = bagel_processes(
        "/robot1",
        extra_arguments=["--duration", "80", "--summary-json", str(summary_path)],
        ros_arguments=[*FAST_BAGEL, "-p", "max_image_side:=128", "-p", "seed:=5"],
    )
    node_set = procs(*spec.command(python=sys.executable))
    camera = ros_client.publisher(Image, "/robot1/camera/exterior/image_raw")
    question = ros_client.publisher(String, "/robot1/bagel/question")
    edit = ros_client.publisher(String, "/robot1/bagel/edit")
    ros_client.wait_for(
        lambda: all(p.get_subscription_count() > 0 for p in (camera, question, edit)),
        60,
        "the BAGEL node's subscriptions",
        [node_set],
    )
    time.sleep(0.5)  # the subscriber's side of discovery completes a little after the publisher's
    name = "mstar: /robot1/bagel"
    question.publish(String(data="what is on the table?"))  # no frame yet
    now = ros_client.node.get_clock().now().to_msg()
    bad_step = _image("rgb8", 16, 8, 3, now)
    bad_step.step = 16  # less than width x channels
    for bad in (_image("16UC1", 8, 8, 2, now), bad_step, _image("mono8", 200, 4, 1, now)):
        camera.publish(bad)
    ros_client.wait_for(lambda: _count(ros_client, name, "messages_dropped") >= 4, 30, "4 drops", [node_set])

    stamp = ros_client.node.get_clock().now().to_msg()
    frame = _image("bgr8", 64, 48, 3, stamp, frame_id="robot1/exterior_camera")
    while _count(ros_client, name, "frames") < 1:  # sensor-data QoS: best effort
        camera.publish(frame)
        time.sleep(0.2)
        assert node_set.proc.poll() is None, node_set.output
    question.publish(String(data="   "))  # empty
    question.publish(String(data="what is on the table?"))
    edit.publish(String(data="the cup in the drawer"))
    ros_client.wait_for(
        lambda: ros_client.got("/robot1/bagel/answer") and ros_client.got("/robot1/goal_image"),
        30,
        "an answer and a goal image",
        [node_set],
    )
    assert node_set.interrupt() == 0, node_set.output

    (goal,) = [g.msg for g in ros_client.got("/robot1/goal_image")]
    assert (goal.encoding, goal.width, goal.height, goal.step, len(goal.data)) == ("rgb8", 64, 48, 192, 64 * 48 * 3)
    assert (goal.header.stamp.sec, goal.header.stamp.nanosec) == (stamp.sec, stamp.nanosec)
    assert goal.header.frame_id == "robot1/exterior_camera"
    assert len(ros_client.got("/robot1/bagel/answer")) == 1
    robot = json.loads(summary_path.read_text())["robots"]["/robot1"]
    assert (robot["answers"], robot["goals"], robot["failed"]) == (1, 1, 0), robot
    assert robot["dropped_by_topic"] == {"/robot1/bagel/question": 2, "/robot1/camera/exterior/image_raw": 3}, robot
    out = node_set.output
    for said in (
        "/robot1/bagel/question: no frame yet on /robot1/camera/exterior/image_raw",
        "image encoding '16UC1' is not supported",
        "step 16 is less than width x channels = 48",
        "image width 200 is over max_image_side 128",
        "/robot1/bagel/question: data is empty",
        "RANDOM",
    ):
        assert said in out, (said, out)


@pytest.fixture(scope="module")
def wm_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("bagel_wm_bag") / "wm"
    write_end_effector_bag(path, EndEffectorBagSpec(robots=1, seconds=4.0, seed=2, width=64, height=64))
    return path


@pytest.mark.timeout(90)
def test_the_goal_bagel_imagines_from_a_bag_is_what_the_world_model_plans_toward(
    procs, start_player, wm_bag, ros_client, tmp_path
):
    from diagnostic_msgs.msg import DiagnosticArray
    from nav_msgs.msg import Path
    from sensor_msgs.msg import Image
    from std_msgs.msg import String

    started = time.monotonic()
    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=500)
    ros_client.subscribe(Image, "/robot1/goal_image")
    ros_client.subscribe(Path, "/robot1/plan/path")
    summaries = tmp_path / "bagel.json", tmp_path / "vjepa2.json"
    specs = bagel_vjepa2_processes(
        "/robot1",
        bagel_extra_arguments=["--duration", "80", "--summary-json", str(summaries[0])],
        vjepa2_extra_arguments=["--duration", "80", "--summary-json", str(summaries[1])],
        bagel_ros_arguments=FAST_BAGEL,
        vjepa2_ros_arguments=["-p", "plan_samples:=8", "-p", "plan_topk:=4", "-p", "plan_iterations:=2"],
    )
    assert [s.executable for s in specs] == ["mstar_bagel_node_set", "mstar_vjepa2_node_set"]
    bagel, world_model = node_sets = [procs(*s.command(python=sys.executable)) for s in specs]
    edit = ros_client.publisher(String, "/robot1/bagel/edit")
    # the bag's camera, pose and gripper (the world model derives its actions from the poses)
    player = start_player(wm_bag, "--topics", "/robot1/camera", "/robot1/ee_pose", "/robot1/gripper")
    ros_client.wait_for(
        lambda: (
            _count(ros_client, "mstar: /robot1/bagel", "frames") >= 1
            and _count(ros_client, "mstar: /robot1/world_model", "frames") >= 1
            and edit.get_subscription_count() > 0
        ),
        60,
        "frames from the bag in both node sets",
        [*node_sets, player],
    )
    edit.publish(String(data="the cup in the drawer"))
    ros_client.wait_for(
        lambda: ros_client.got("/robot1/goal_image") and ros_client.got("/robot1/plan/path"),
        40,
        "BAGEL's goal image and a plan toward it",
        [*node_sets, player],
    )
    goal_at = ros_client.got("/robot1/goal_image")[0].arrival
    # BAGEL is the goal topic's only publisher: the world model's goal is the image BAGEL made
    publishers = ros_client.node.get_publishers_info_by_topic("/robot1/goal_image")
    assert [(p.node_namespace, p.node_name) for p in publishers] == [("/robot1", "bagel")], publishers
    for proc in node_sets:
        assert proc.interrupt() == 0, proc.output
    player.interrupt()

    (goal,) = [g.msg for g in ros_client.got("/robot1/goal_image")]
    assert (goal.encoding, goal.width, goal.height) == ("rgb8", 64, 64)
    assert goal.header.frame_id  # the bag's camera frame
    assert all(g.arrival > goal_at for g in ros_client.got("/robot1/plan/path"))  # no plan without a goal
    made = json.loads(summaries[0].read_text())["robots"]["/robot1"]
    assert (made["edits"], made["goals"], made["failed"]) == (1, 1, 0), made
    planned = json.loads(summaries[1].read_text())["robots"]["/robot1"]
    assert planned["goals"] == 1 and planned["plans"] >= 1 and planned["plans_failed"] == 0, planned
    assert "goal set: planning" in world_model.output, world_model.output
    assert "edited the frame by 'the cup in the drawer'" in bagel.output, bagel.output
    assert time.monotonic() - started < 60


@pytest.mark.timeout(60)
def test_a_bad_parameter_ends_the_node_set_with_status_2_naming_it(procs):
    (spec,) = bagel_processes("/robot1", ros_arguments=["-p", "max_pending:=0"])
    node_set = procs(*spec.command(python=sys.executable))
    assert node_set.proc.wait(timeout=50) == 2, node_set.output
    node_set._reader.join(timeout=5)
    assert "/robot1/bagel: parameter max_pending: Expected `int` >= 1" in node_set.output
    assert "Traceback" not in node_set.output
