"""use_sim_time in every node set: the launch argument, the launch files' Nodes, `mstar-ros launch --use-sim-time`.

The launch files are loaded against the stand-ins of test/support/launch_standins.py (`launch` and
`launch_ros` are not on PyPI); what reaches the node processes is checked on their command lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mstar_ros.cli.main import main
from mstar_ros.launch_spec import (
    LAUNCH_ARGUMENTS,
    ORPHEUS_LAUNCH_ARGUMENTS,
    VJEPA2_LAUNCH_ARGUMENTS,
    orpheus_processes,
    pi05_processes,
    vjepa2_processes,
)
from support.launch_standins import describe, launch_ros_command, load_launch_file, nodes

ROOT = Path(__file__).resolve().parents[2]
SIM_TIME = ["-p", "use_sim_time:=true"]
NODE_SETS = [
    ("pi05", pi05_processes, LAUNCH_ARGUMENTS),
    ("orpheus", orpheus_processes, ORPHEUS_LAUNCH_ARGUMENTS),
    ("vjepa2", vjepa2_processes, VJEPA2_LAUNCH_ARGUMENTS),
]


def _ros_args(command: list[str]) -> list[str]:
    return command[command.index("--ros-args") + 1 :] if "--ros-args" in command else []


@pytest.mark.parametrize("name, processes, arguments", NODE_SETS)
def test_use_sim_time_reaches_every_process_over_its_params_file_and_under_the_users_ros_args(
    name, processes, arguments
):
    assert ("use_sim_time", "false") in [(a.name, a.default) for a in arguments]
    for spec in processes(use_sim_time="true", ros_arguments=["-p", "use_sim_time:=false"]):
        ros = _ros_args(spec.command())
        at = ros.index("use_sim_time:=true") - 1
        assert ros[at : at + 2] == SIM_TIME, ros
        assert all(ros.index(f) < at for f in spec.params_files)  # over the params file ...
        assert ros[-2:] == ["-p", "use_sim_time:=false"]  # ... and a user's own --ros-args win
    for off in ("false", "0", False):
        assert all("use_sim_time:=true" not in spec.command() for spec in processes(use_sim_time=off))
    with pytest.raises(ValueError, match="use_sim_time: expected true or false, got 'sim'"):
        processes(use_sim_time="sim")


@pytest.mark.parametrize("name, processes, arguments", NODE_SETS)
def test_every_launch_file_passes_use_sim_time_to_its_nodes(monkeypatch, name, processes, arguments):
    module = load_launch_file(ROOT / "launch" / f"{name}.launch.py", monkeypatch)
    declared, entities = describe(module, {"use_sim_time": "true"})
    assert ("use_sim_time", "false") in [(d.args[0], d.kwargs["default_value"]) for d in declared]
    specs = processes(**{a.name: "true" if a.name == "use_sim_time" else a.default for a in arguments})
    built = nodes(entities)
    assert [launch_ros_command(n) for n in built] == [s.command() for s in specs]
    for node in built:  # a typed parameter after the params files, as `parameters=[file, {...}]` is written
        assert node.kwargs["parameters"][-1] == {"use_sim_time": True}
    _declared, plain = describe(module, {})
    assert all(not any(isinstance(p, dict) for p in n.kwargs["parameters"]) for n in nodes(plain))


@pytest.mark.parametrize("name", ["pi05", "orpheus", "vjepa2"])
def test_mstar_ros_launch_use_sim_time(name, capsys):
    assert main(["launch", name, "--use-sim-time", "--print-commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.split()[-2:] == SIM_TIME for line in lines), lines
    assert main(["launch", name, "--print-commands"]) == 0
    assert "use_sim_time" not in capsys.readouterr().out
