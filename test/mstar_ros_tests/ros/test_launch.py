"""One description of the node set: mstar_ros.launch_spec, launch/pi05.launch.py, `mstar-ros launch pi05`.

`launch` / `launch_ros` are not on PyPI, so the launch file is loaded against small stand-ins
that record what it builds; the command a launch_ros Node would run is rebuilt the way
launch_ros lays it out and must equal the spec's.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

from mstar_ros.launch_spec import (LAUNCH_ARGUMENTS, ORPHEUS_LAUNCH_ARGUMENTS, default_params_file, orpheus_processes,
                                   parse_robots, pi05_processes)
from mstar_ros.ros.policy_node import PARAMETERS

ROOT = Path(__file__).resolve().parents[3]


def test_the_params_file_holds_every_policy_parameter_with_its_default_type():
    text = default_params_file().read_text()
    assert default_params_file() == ROOT / "config" / "pi05.yaml"
    params = yaml.safe_load(text)["/**"]["ros__parameters"]
    cameras = params.pop("cameras")  # cameras.<name>: one per camera of the checkpoint
    from mstar_graphs.pi05.checkpoint_layout import inspect_checkpoint
    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05
    assert tuple(cameras) == inspect_checkpoint(ensure_tiny_pi05()).cameras
    assert all(isinstance(t, str) and t for t in cameras.values())
    assert set(params) == set(PARAMETERS)
    for name, value in params.items():
        default = PARAMETERS[name][0]
        if default is None:  # declared by type (joint limits): floats
            assert isinstance(value, list) and {type(v) for v in value} == {float}, name
            continue
        assert type(value) is type(default), name  # rclpy refuses a type change (15 for 15.0)
        if isinstance(value, list):
            assert {type(v) for v in value} == {type(default[0])}, name


def test_launch_arguments_become_the_node_set_command(tmp_path):
    placement = tmp_path / "p.yaml"
    placement.write_text("world_size: 1\n")
    (p,) = pi05_processes("robot1, /robot2 /arm/left", "/w", str(placement), "20", "", "2", extra_arguments=["--duration", "5"],
                          remappings=[("/robot1/action_chunk", "/x")], ros_arguments=["-p", "smooth:=false"])
    assert p.command() == ["mstar_pi05_node_set", "--robots", "/robot1", "/robot2", "/arm/left", "--weights", "/w",
                           "--placement", str(placement), "--rate", "20.0", "--max-inflight", "2", "--duration", "5",
                           "--ros-args",
                           "--params-file", str(default_params_file()), "-r", "/robot1/action_chunk:=/x",
                           "-p", "smooth:=false"]
    assert p.command(python="py")[:3] == ["py", "-m", "mstar_ros.ros.node_set"]
    assert parse_robots(["/a", "b,c"]) == ["/a", "/b", "/c"]
    for bad, says in [(dict(robots=""), "at least one"), (dict(robots="/9x"), "not a valid ROS namespace"),
                      (dict(robots="/a /a"), "twice"), (dict(rate="fast"), "expected Hz"), (dict(rate="0"), "> 0"),
                      (dict(placement="/nope.yaml"), "no file"), (dict(params_file="/nope.yaml"), "no file"),
                      (dict(max_inflight="-1"), "a count >= 0"), (dict(max_inflight="two"), "a count >= 0")]:
        with pytest.raises((ValueError, FileNotFoundError), match=says):
            pi05_processes(**bad)


# -- launch/pi05.launch.py against stand-ins for launch / launch_ros ---------------------------------

class _Recorder:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _LaunchConfiguration(_Recorder):
    def perform(self, context) -> str:
        return context.launch_configurations[self.args[0]]


def _launch_ros_command(node: _Recorder) -> list[str]:
    """The command launch_ros.actions.Node runs (no name, namespace or ros_arguments given):
    executable, arguments, --ros-args, a --params-file per parameters entry, -r per remapping."""
    kw = node.kwargs
    assert set(kw) <= {"package", "executable", "arguments", "parameters", "remappings", "output"}, kw
    cmd = [kw["executable"], *kw.get("arguments", []), "--ros-args"]
    for params in kw.get("parameters", []):
        assert isinstance(params, str)
        cmd += ["--params-file", params]
    for src, dst in kw.get("remappings", []):
        cmd += ["-r", f"{src}:={dst}"]
    return cmd


@pytest.fixture
def load_launch_file(monkeypatch):
    mods = {name: types.ModuleType(name) for name in
            ("launch", "launch.actions", "launch.substitutions", "launch_ros", "launch_ros.actions")}
    mods["launch"].LaunchDescription = type("LaunchDescription", (_Recorder,), {})
    mods["launch.actions"].DeclareLaunchArgument = type("DeclareLaunchArgument", (_Recorder,), {})
    mods["launch.actions"].OpaqueFunction = type("OpaqueFunction", (_Recorder,), {})
    mods["launch.substitutions"].LaunchConfiguration = _LaunchConfiguration
    mods["launch_ros.actions"].Node = type("Node", (_Recorder,), {})
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name.replace(".", "_"), ROOT / "launch" / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture
def launch_file(load_launch_file):
    return load_launch_file("pi05.launch.py")


@pytest.mark.parametrize("given", [{}, {"robots": "/robot1 /robot2", "rate": "10", "weights": "/models/pi05",
                                         "max_inflight": "1"}])
def test_the_launch_file_builds_the_commands_of_the_spec(launch_file, given):
    (description,) = launch_file.generate_launch_description().args
    declared = [a for a in description if type(a).__name__ == "DeclareLaunchArgument"]
    (opaque,) = [a for a in description if type(a).__name__ == "OpaqueFunction"]
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == [(a.name, a.default) for a in LAUNCH_ARGUMENTS]
    assert all(d.kwargs["description"] for d in declared)
    # what `ros2 launch mstar_ros pi05.launch.py NAME:=VALUE ...` gives the OpaqueFunction
    context = types.SimpleNamespace(launch_configurations={a.name: given.get(a.name, a.default) for a in LAUNCH_ARGUMENTS})
    nodes = opaque.kwargs["function"](context)
    specs = pi05_processes(**context.launch_configurations)
    assert [n.kwargs["package"] for n in nodes] == ["mstar_ros"] * len(specs)
    assert [_launch_ros_command(n) for n in nodes] == [s.command() for s in specs]


@pytest.mark.parametrize("given", [{}, {"split": "false", "namespace": "/speech"}])
def test_the_orpheus_launch_file_builds_the_commands_of_the_spec(load_launch_file, given):
    (description,) = load_launch_file("orpheus.launch.py").generate_launch_description().args
    declared = [a for a in description if type(a).__name__ == "DeclareLaunchArgument"]
    (opaque,) = [a for a in description if type(a).__name__ == "OpaqueFunction"]
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == \
        [(a.name, a.default) for a in ORPHEUS_LAUNCH_ARGUMENTS]
    context = types.SimpleNamespace(launch_configurations={a.name: given.get(a.name, a.default)
                                                           for a in ORPHEUS_LAUNCH_ARGUMENTS})
    nodes = opaque.kwargs["function"](context)
    specs = orpheus_processes(**context.launch_configurations)
    assert [_launch_ros_command(n)[:-1] for n in nodes] == [s.command() for s in specs]  # [:-1]: --ros-args
    parts = [s.arguments[1] for s in specs]
    assert parts == (["all"] if given else ["talker", "vocoder"])
    for bad, says in [(dict(split="maybe"), "expected true or false"), (dict(namespace="/9"), "not a valid ROS"),
                      (dict(weights="/nope"), "weights: no directory")]:
        with pytest.raises((ValueError, FileNotFoundError), match=says):
            orpheus_processes(**bad)


def test_setup_installs_the_launch_file_config_and_executable_where_ros2_launch_looks():
    text = (ROOT / "setup.py").read_text()
    for needed in ('"share/mstar_ros/launch", sorted(glob("launch/*.launch.py"))', '"share/mstar_ros/config"',
                   '"share/ament_index/resource_index/packages", ["resource/mstar_ros"]',
                   '"mstar_pi05_node_set = mstar_ros.ros.node_set:main"',
                   '"mstar_orpheus_node = mstar_ros.ros.orpheus_node:main"'):
        assert needed in text
    assert "install_scripts=$base/lib/mstar_ros" in (ROOT / "setup.cfg").read_text()  # colcon: lib/<package>/


# -- `mstar-ros launch pi05` for real: remapping and parameters reach the nodes -----------------------

@pytest.mark.timeout(120)
def test_mstar_ros_launch_applies_ros_args_remapping_and_parameters(procs, start_player, short_bag, ros_client,
                                                                   tmp_path):
    from trajectory_msgs.msg import JointTrajectory

    params = tmp_path / "params.yaml"  # a params file of our own: the -p after it wins over it
    config = yaml.safe_load(default_params_file().read_text())
    config["/**"]["ros__parameters"]["control_rate_hz"] = 12.0
    params.write_text(yaml.safe_dump(config))
    ros_client.subscribe(JointTrajectory, "/arm_left/trajectory")
    ros_client.subscribe(JointTrajectory, "/robot1/action_chunk")
    summary = tmp_path / "summary.json"
    launcher = procs(sys.executable, "-m", "mstar_ros.cli", "launch", "pi05", "--robots", "/robot1",
                     "--params-file", str(params), "--summary-json", str(summary),
                     "--ros-args", "-r", "/robot1/action_chunk:=/arm_left/trajectory",
                     "-p", "control_rate_hz:=20.0", "-p", "prompt:=stack the red block")
    player = start_player(short_bag, "--topics", "/robot1")
    ros_client.wait_for(lambda: len(ros_client.got("/arm_left/trajectory")) >= 2, 90,
                        "2 chunks on the remapped topic", [launcher, player])
    # the prompt parameter can be changed while serving (as `ros2 param set` does), never to ""
    assert [r.successful for r in _set_param(ros_client, "/robot1/pi05_policy", "prompt", "   ")] == [False]
    assert [r.successful for r in _set_param(ros_client, "/robot1/pi05_policy", "prompt", "open it")] == [True]
    assert launcher.interrupt() == 0, launcher.output  # Ctrl-C stops the node set it started
    player.interrupt()
    assert "[launch] pi05_node_set exited with status 0" in launcher.output
    assert ros_client.got("/robot1/action_chunk") == []  # remapped away
    for got in ros_client.got("/arm_left/trajectory"):
        t = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in got.msg.points]
        assert np.allclose(np.diff(t), 1 / 20.0, atol=1e-6)  # -p control_rate_hz:=20.0, not the file's 12
    robot = json.loads(summary.read_text())["robots"]["/robot1"]
    assert robot["rate_hz"] == 20.0 and robot["chunks"] >= 2
    assert "-p prompt:=stack the red block" in launcher.output and robot["prompt"] == "open it"


def _set_param(ros_client, node: str, name: str, value: str) -> list:
    import time

    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient

    client = AsyncParameterClient(ros_client.node, node)
    assert client.wait_for_services(timeout_sec=20)
    future = client.set_parameters([Parameter(name, value=value)])
    deadline = time.monotonic() + 20
    while not future.done():  # the client's thread spins the executor
        assert time.monotonic() < deadline, f"no answer from {node}"
        time.sleep(0.02)
    return future.result().results
