"""The edge box's launch: mstar_ros.edge.launch_spec, launch/edge.launch.py (against the launch stand-ins) and
``mstar-ros launch edge`` end to end: one process serving a robot's action chunks, speech and images."""

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


def test_the_default_config_is_one_host_process():
    (spec,) = edge_processes(cores=2)
    assert spec.name == "edge_box" and spec.command()[:5] == [
        "mstar_edge_host",
        "--config",
        str(ROOT / "config" / "edge.yaml"),
        "--process",
        "box",
    ]
    assert spec.command(python="py")[:3] == ["py", "-m", "mstar_ros.edge.host"]


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
    gateway: {port: 0, voice: {model: orpheus}, images: {model: bagel}}
"""


def _post(url: str, body: dict) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.headers["Content-Type"], response.read()


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_mstar_ros_launch_edge_serves_chunks_speech_and_images_from_one_process(
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
    ros_client.wait_for(lambda: "gateway http://" in "\n".join(launcher.lines), 90, "the gateway", [launcher])
    (url,) = re.findall(r"gateway (http://127\.0\.0\.1:\d+)", "\n".join(launcher.lines))
    feed = robot_feed("/robot1", CAMERAS, JOINTS, positions=MIDDLE).start()
    status, kind, audio = _post(
        f"{url}/v1/audio/speech",
        {"model": "orpheus", "input": "Hi.", "voice": "tara", "response_format": "wav", "max_tokens": 64},
    )
    assert status == 200 and kind == "audio/wav" and audio[:4] == b"RIFF" and len(audio) > 44
    status, _, body = _post(
        f"{url}/v1/images/generations", {"model": "bagel", "prompt": "a red block", "size": "64x64", "steps": 2}
    )
    (image,) = json.loads(body)["data"]
    assert status == 200 and image["b64_json"]
    ros_client.wait_for(lambda: ros_client.got("/robot1/action_chunk"), 60, "an action chunk", [launcher])
    feed.close()
    assert launcher.interrupt() == 0, launcher.output
    out = launcher.output
    serving = "edge process 'box' serving pi0.5 for /robot1 [control], voice (orpheus) [interactive], images (bagel)"
    assert f"{serving} [batch] on one device thread (2 intra-op threads;" in out  # not the test's OMP_NUM_THREADS=1
    assert "[launch] edge_box exited with status 0" in out
    chunk = ros_client.got("/robot1/action_chunk")[0].msg
    assert list(chunk.joint_names) == JOINTS and len(chunk.points) > 1
    assert json.loads(summary.read_text())["robots"]["/robot1"]["chunks"] >= 1
