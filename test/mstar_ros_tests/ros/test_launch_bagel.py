"""launch/bagel.launch.py and launch/bagel_vjepa2.launch.py against mstar_ros.launch_spec_bagel (loaded with the
stand-ins for launch / launch_ros), and config/bagel.yaml against the BAGEL node's parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mstar_ros.launch_spec_bagel import (
    BAGEL_LAUNCH_ARGUMENTS,
    BAGEL_VJEPA2_LAUNCH_ARGUMENTS,
    bagel_processes,
    bagel_vjepa2_processes,
)
from mstar_ros.ros.bagel.params import PARAMETERS
from support.launch_standins import describe, launch_ros_command, load_launch_file, nodes

ROOT = Path(__file__).resolve().parents[3]


def _declared_match(declared, arguments) -> None:
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == [(a.name, a.default) for a in arguments]
    assert all(d.kwargs["description"] for d in declared)


@pytest.mark.parametrize("given", [{}, {"robots": "/arm_left,/arm_right", "weights": str(ROOT / "config")}])
def test_the_bagel_launch_file_builds_the_commands_of_the_spec(monkeypatch, given):
    declared, entities = describe(load_launch_file(ROOT / "launch" / "bagel.launch.py", monkeypatch), given)
    _declared_match(declared, BAGEL_LAUNCH_ARGUMENTS)
    specs = bagel_processes(**{a.name: given.get(a.name, a.default) for a in BAGEL_LAUNCH_ARGUMENTS})
    assert [launch_ros_command(n) for n in nodes(entities)] == [s.command() for s in specs]
    (spec,) = specs
    assert spec.params_files == (str(ROOT / "config" / "bagel.yaml"),)
    assert spec.command(python="py")[:3] == ["py", "-m", "mstar_ros.ros.bagel.node_set"]
    if given:
        assert spec.arguments[:5] == ("--robots", "/arm_left", "/arm_right", "--weights", str(ROOT / "config"))
    for bad, says in [
        (dict(robots="/9"), "not a valid ROS"),
        (dict(weights="/nope"), "weights: no directory"),
        (dict(placement="/nope.yaml"), "placement: no file"),
        (dict(params_file="/nope.yaml"), "params_file: no file"),
        (dict(dtype="float8"), "dtype: expected one of"),
    ]:
        with pytest.raises((ValueError, FileNotFoundError), match=says):
            bagel_processes(**bad)


def test_the_composite_launch_file_runs_bagel_beside_the_world_models(monkeypatch):
    given = {"robots": "/robot1 /robot2", "use_sim_time": "true"}
    path = ROOT / "launch" / "bagel_vjepa2.launch.py"
    declared, entities = describe(load_launch_file(path, monkeypatch), given)
    _declared_match(declared, BAGEL_VJEPA2_LAUNCH_ARGUMENTS)
    specs = bagel_vjepa2_processes(**{a.name: given.get(a.name, a.default) for a in BAGEL_VJEPA2_LAUNCH_ARGUMENTS})
    assert [launch_ros_command(n) for n in nodes(entities)] == [s.command() for s in specs]
    assert [s.executable for s in specs] == ["mstar_bagel_node_set", "mstar_vjepa2_node_set"]
    assert all(s.arguments[:3] == ("--robots", "/robot1", "/robot2") for s in specs)
    assert all(s.parameters == (("use_sim_time", True),) for s in specs)


def test_the_goal_topic_defaults_meet_the_world_models():
    """BAGEL's goal images go, by default, where the world model of its namespace reads its goal."""
    from mstar_ros.ros.vjepa2.params import PARAMETERS as WM

    assert PARAMETERS["goal_topic"][0] == WM["goal_topic"][0]
    assert PARAMETERS["camera_topic"][0] == WM["camera_topic"][0]


def test_the_bagel_params_file_holds_every_parameter_with_its_default():
    params = yaml.safe_load((ROOT / "config" / "bagel.yaml").read_text())["/**"]["ros__parameters"]
    assert params == {name: default for name, (default, _) in PARAMETERS.items()}
    for name, value in params.items():
        assert type(value) is type(PARAMETERS[name][0]), name  # rclpy refuses a type change (5 for 5.0)


def test_mstar_ros_launch_starts_the_same_commands(capsys):
    from mstar_ros.cli import main

    assert (
        main(
            ["launch", "bagel", "--robots", "/r1", "--duration", "5", "--print-commands", "--ros-args", "-p", "seed:=3"]
        )
        == 0
    )
    (spec,) = bagel_processes("/r1", extra_arguments=["--duration", "5.0"], ros_arguments=["-p", "seed:=3"])
    assert capsys.readouterr().out.splitlines() == [" ".join(spec.command())]
    assert (
        main(
            ["launch", "bagel-vjepa2", "--vjepa2-params-file", str(ROOT / "config" / "vjepa2.yaml"), "--print-commands"]
        )
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [" ".join(s.command()) for s in bagel_vjepa2_processes()]
