"""The edge box's launch: mstar_ros.edge.launch_spec, launch/edge.launch.py (against the launch stand-ins) and
``mstar-ros launch edge`` end to end: a robot's action chunks and speech from one process, images from an idle one."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from mstar_ros.edge.config import EdgeConfigError
from mstar_ros.edge.launch_spec import EDGE_LAUNCH_ARGUMENTS, edge_processes
from mstar_ros.launch_spec import default_params_file
from support.launch_standins import describe, launch_ros_command, load_launch_file, nodes

ROOT = Path(__file__).resolve().parents[3]
PI05 = yaml.safe_load(default_params_file().read_text())["/**"]["ros__parameters"]
JOINTS, CAMERAS = PI05["joint_names"], list(PI05["cameras"].values())
MIDDLE = [(a + b) / 2 for a, b in zip(PI05["joint_lower"], PI05["joint_upper"])]

TWO_PROCESSES = """\
processes:
  - name: control
    threads: 1
    pi05: {robots: [/robot1]}
  - name: media
    threads: 1
    gateway: {port: 0, voice: {model: orpheus}}
"""


def test_the_default_config_is_a_host_process_for_the_box_and_one_for_batch():
    box, batch = edge_processes(cores=2)
    for spec, name in ((box, "box"), (batch, "batch")):
        assert spec.name == f"edge_{name}" and spec.command()[:5] == [
            "mstar_edge_host",
            "--config",
            str(ROOT / "config" / "edge.yaml"),
            "--process",
            name,
        ]
    assert box.command(python="py")[:3] == ["py", "-m", "mstar_ros.edge.host"]


def test_each_process_group_is_a_process_with_its_own_summary(tmp_path):
    config = tmp_path / "edge.yaml"
    config.write_text(TWO_PROCESSES)
    control, media = edge_processes(
        str(config),
        "2",
        "float32",
        "true",
        cores=2,
        summary_json=str(tmp_path / "s.json"),
        ros_arguments=["-p", "a:=1"],
    )
    assert control.command() == [
        *("mstar_edge_host", "--config", str(config), "--process", "control"),
        *("--dtype", "float32", "--status-every", "2.0", "--summary-json", str(tmp_path / "s-control.json")),
        *("--ros-args", "-p", "use_sim_time:=true", "-p", "a:=1"),
    ]
    assert media.arguments[3] == "media" and media.ros_args() == []  # no robots: no rclpy, no ROS arguments
    with pytest.raises(EdgeConfigError, match=r"edge.yaml:1: processes: 2 intra-op threads .* 1 cores"):
        edge_processes(str(config), cores=1)
    with pytest.raises(ValueError, match="status_every: expected seconds"):
        edge_processes(str(config), "often", cores=2)


def test_the_launch_file_builds_the_commands_of_the_spec(monkeypatch, tmp_path):
    config = tmp_path / "edge.yaml"
    config.write_text(TWO_PROCESSES)
    given = {"config": str(config), "dtype": "float32"}
    declared, entities = describe(load_launch_file(ROOT / "launch" / "edge.launch.py", monkeypatch), given)
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == [
        (a.name, a.default) for a in EDGE_LAUNCH_ARGUMENTS
    ]
    specs = edge_processes(**{a.name: given.get(a.name, a.default) for a in EDGE_LAUNCH_ARGUMENTS})
    assert [n.kwargs["executable"] for n in nodes(entities)] == ["mstar_edge_host"] * 2
    assert [launch_ros_command(n)[: len(s.command())] for n, s in zip(nodes(entities), specs)] == [
        s.command() for s in specs
    ]


E2E_CONFIG = """\
processes:
  - name: box
    threads: 2
    pi05: {robots: [/robot1]}
    gateway: {port: 0, voice: {model: orpheus}}
  - name: batch
    threads: 2
    scheduling: idle
    gateway: {port: 0, images: {model: bagel}}
"""


def _post(url: str, body: dict) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.headers["Content-Type"], response.read()


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_mstar_ros_launch_edge_serves_chunks_and_speech_beside_images_in_an_idle_process(
    procs, ros_client, robot_feed, tmp_path
):
    from trajectory_msgs.msg import JointTrajectory

    config = tmp_path / "edge.yaml"
    config.write_text(E2E_CONFIG)
    summary = tmp_path / "summary.json"
    ros_client.subscribe(JointTrajectory, "/robot1/action_chunk")
    launcher = procs(
        sys.executable, "-m", "mstar_ros.cli", "launch", "edge", "--config", str(config), "--summary-json", str(summary)
    )
    ros_client.wait_for(
        lambda: "\n".join(launcher.lines).count("gateway http://") == 2, 90, "the two gateways", [launcher]
    )
    out = "\n".join(launcher.lines)
    (url,) = re.findall(r"'box' serving .*\n(?:.*\n)*?  gateway (http://127\.0\.0\.1:\d+)", out)
    (images_url,) = re.findall(r"'batch' serving .*\n(?:.*\n)*?  gateway (http://127\.0\.0\.1:\d+)", out)
    feed = robot_feed("/robot1", CAMERAS, JOINTS, positions=MIDDLE).start()
    status, kind, audio = _post(
        f"{url}/v1/audio/speech",
        {"model": "orpheus", "input": "Hi.", "voice": "tara", "response_format": "wav", "max_tokens": 64},
    )
    assert status == 200 and kind == "audio/wav" and audio[:4] == b"RIFF" and len(audio) > 44
    status, _, body = _post(
        f"{images_url}/v1/images/generations", {"model": "bagel", "prompt": "a red block", "size": "64x64", "steps": 2}
    )
    (image,) = json.loads(body)["data"]
    assert status == 200 and image["b64_json"]
    ros_client.wait_for(lambda: ros_client.got("/robot1/action_chunk"), 60, "an action chunk", [launcher])
    feed.close()
    assert launcher.interrupt() == 0, launcher.output
    out = launcher.output
    serving = "edge process 'box' serving pi0.5 for /robot1 [control], voice (orpheus) [interactive]"
    # the group's threads, not the test's OMP_NUM_THREADS=1
    assert f"{serving} on one device thread (2 intra-op threads, CPU scheduling normal;" in out
    batch = "edge process 'batch' serving images (bagel) [batch] on one device thread"
    assert f"{batch} (2 intra-op threads, CPU scheduling idle;" in out
    assert "[launch] edge_box exited with status 0" in out and "[launch] edge_batch exited with status 0" in out
    chunk = ros_client.got("/robot1/action_chunk")[0].msg
    assert list(chunk.joint_names) == JOINTS and len(chunk.points) > 1
    assert json.loads((tmp_path / "summary-box.json").read_text())["robots"]["/robot1"]["chunks"] >= 1
    assert json.loads((tmp_path / "summary-batch.json").read_text())["process"] == "batch"
