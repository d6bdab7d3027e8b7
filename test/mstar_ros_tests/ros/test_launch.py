"""One description of the node set: mstar_ros.launch_spec, launch/*.launch.py, `mstar-ros launch`.

`launch` / `launch_ros` are not on PyPI, so the launch files are loaded against small stand-ins
that record what they build (test/support/launch_standins.py); the command a launch_ros Node
would run is rebuilt the way launch_ros lays it out and must equal the spec's, and each Node's
on_exit must end the launch (non-zero with the process's one-line error when it failed).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml

from mstar_ros.launch_actions import NodeProcessFailed
from mstar_ros.launch_spec import (
    LAUNCH_ARGUMENTS,
    ORPHEUS_LAUNCH_ARGUMENTS,
    VJEPA2_LAUNCH_ARGUMENTS,
    default_params_file,
    orpheus_processes,
    parse_robots,
    pi05_processes,
    vjepa2_processes,
)
from mstar_ros.ros.pi05.params import PARAMETERS
from support.launch_standins import describe, launch_ros_command, load_launch_file, nodes

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
        if default is None:  # declared by type: joint limits floats, action_names strings ([]: joint_names)
            want = {str} if name == "action_names" else {float}
            assert isinstance(value, list) and {type(v) for v in value} == (want if value else set()), name
            assert value or name == "action_names", name
            continue
        assert type(value) is type(default), name  # rclpy refuses a type change (15 for 15.0)
        if isinstance(value, list):
            assert {type(v) for v in value} == {type(default[0])}, name


def test_launch_arguments_become_the_node_set_command(tmp_path):
    placement = tmp_path / "p.yaml"
    placement.write_text("world_size: 1\n")
    (p,) = pi05_processes(
        "robot1, /robot2 /arm/left",
        "/w",
        str(placement),
        "20",
        "",
        "2",
        extra_arguments=["--duration", "5"],
        remappings=[("/robot1/action_chunk", "/x")],
        ros_arguments=["-p", "smooth:=false"],
    )
    assert p.command() == [
        "mstar_pi05_node_set",
        "--robots",
        "/robot1",
        "/robot2",
        "/arm/left",
        "--weights",
        "/w",
        "--placement",
        str(placement),
        "--rate",
        "20.0",
        "--max-inflight",
        "2",
        "--duration",
        "5",
        "--ros-args",
        "--params-file",
        str(default_params_file()),
        "-r",
        "/robot1/action_chunk:=/x",
        "-p",
        "smooth:=false",
    ]
    assert p.command(python="py")[:3] == ["py", "-m", "mstar_ros.ros.pi05.node_set"]
    assert parse_robots(["/a", "b,c"]) == ["/a", "/b", "/c"]
    for bad, says in [
        (dict(robots=""), "at least one"),
        (dict(robots="/9x"), "not a valid ROS namespace"),
        (dict(robots="/a /a"), "twice"),
        (dict(rate="fast"), "expected Hz"),
        (dict(rate="0"), "> 0"),
        (dict(placement="/nope.yaml"), "no file"),
        (dict(params_file="/nope.yaml"), "no file"),
        (dict(max_inflight="-1"), "a count >= 0"),
        (dict(max_inflight="two"), "a count >= 0"),
    ]:
        with pytest.raises((ValueError, FileNotFoundError), match=says):
            pi05_processes(**bad)


# -- launch/pi05.launch.py against stand-ins for launch / launch_ros ---------------------------------


def _load(monkeypatch, name: str):
    return load_launch_file(ROOT / "launch" / name, monkeypatch)


@pytest.mark.parametrize(
    "given",
    [
        {},
        {
            "robots": "/robot1 /robot2",
            "rate": "10",
            "weights": "/models/pi05",
            "max_inflight": "1",
            "prompt": "stack the red block",
            "status_every": "5",
        },
    ],
)
def test_the_launch_file_builds_the_commands_of_the_spec(monkeypatch, given):
    declared, entities = describe(_load(monkeypatch, "pi05.launch.py"), given)
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == [(a.name, a.default) for a in LAUNCH_ARGUMENTS]
    assert all(d.kwargs["description"] for d in declared)
    specs = pi05_processes(**{a.name: given.get(a.name, a.default) for a in LAUNCH_ARGUMENTS})
    assert [n.kwargs["package"] for n in nodes(entities)] == ["mstar_ros"] * len(specs)
    assert [launch_ros_command(n) for n in nodes(entities)] == [s.command() for s in specs]
    if given:
        assert "--prompt=stack the red block" in specs[0].arguments and "--status-every" in specs[0].arguments


@pytest.mark.parametrize("given", [{}, {"split": "false", "namespace": "/speech"}])
def test_the_orpheus_launch_file_builds_the_commands_of_the_spec(monkeypatch, given):
    declared, entities = describe(_load(monkeypatch, "orpheus.launch.py"), given)
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == [
        (a.name, a.default) for a in ORPHEUS_LAUNCH_ARGUMENTS
    ]
    specs = orpheus_processes(**{a.name: given.get(a.name, a.default) for a in ORPHEUS_LAUNCH_ARGUMENTS})
    assert [launch_ros_command(n)[:-1] for n in nodes(entities)] == [s.command() for s in specs]  # [:-1]: --ros-args
    parts = [s.arguments[1] for s in specs]
    assert parts == (["all"] if given else ["talker", "vocoder"])
    for bad, says in [
        (dict(split="maybe"), "expected true or false"),
        (dict(namespace="/9"), "not a valid ROS"),
        (dict(weights="/nope"), "weights: no directory"),
    ]:
        with pytest.raises((ValueError, FileNotFoundError), match=says):
            orpheus_processes(**bad)


def _exited(returncode: int):
    """launch.events.process.ProcessExited's shape, as on_exit gets it."""
    return types.SimpleNamespace(returncode=returncode)


@pytest.mark.parametrize("given", [{}, {"robots": "/arm_left,/arm_right", "weights": str(ROOT / "config")}])
def test_the_vjepa2_launch_file_builds_the_commands_of_the_spec(monkeypatch, given):
    declared, entities = describe(_load(monkeypatch, "vjepa2.launch.py"), given)
    assert [(d.args[0], d.kwargs["default_value"]) for d in declared] == [
        (a.name, a.default) for a in VJEPA2_LAUNCH_ARGUMENTS
    ]
    specs = vjepa2_processes(**{a.name: given.get(a.name, a.default) for a in VJEPA2_LAUNCH_ARGUMENTS})
    assert [launch_ros_command(n) for n in nodes(entities)] == [s.command() for s in specs]
    assert specs[0].params_files == (str(ROOT / "config" / "vjepa2.yaml"),)
    assert specs[0].command(python="py")[:3] == ["py", "-m", "mstar_ros.ros.vjepa2.node_set"]
    for bad, says in [
        (dict(robots="/9"), "not a valid ROS"),
        (dict(weights="/nope"), "weights: no file"),
        (dict(params_file="/nope.yaml"), "no file"),
    ]:
        with pytest.raises((ValueError, FileNotFoundError), match=says):
            vjepa2_processes(**bad)


def test_the_vjepa2_params_file_holds_every_world_model_parameter_with_its_default_type():
    from mstar_ros.ros.vjepa2.params import PARAMETERS as WM

    params = yaml.safe_load((ROOT / "config" / "vjepa2.yaml").read_text())["/**"]["ros__parameters"]
    assert set(params) == set(WM)
    for name, value in params.items():
        assert type(value) is type(WM[name][0]), name


@pytest.mark.parametrize(
    "launch_file",
    [
        "pi05.launch.py",
        "orpheus.launch.py",
        "vjepa2.launch.py",
        "bagel.launch.py",
        "bagel_vjepa2.launch.py",
        "edge.launch.py",
    ],
)
def test_a_node_process_that_exits_ends_the_launch_and_a_failure_ends_it_non_zero(monkeypatch, launch_file):
    """Every Node shuts the launch down when its process exits: status 0 -> a Shutdown action (ros2 launch
    exits 0); another status while running -> an exception naming the process, its status and the last line
    it wrote to stderr (launch.LaunchService logs it, shuts down and returns 1); during a shutdown -> nothing."""
    _declared, entities = describe(_load(monkeypatch, launch_file), {})
    handlers = [e for e in entities if type(e).__name__ == "RegisterEventHandler"]
    assert len(handlers) == len(nodes(entities)) >= 1
    running, stopping = types.SimpleNamespace(is_shutdown=False), types.SimpleNamespace(is_shutdown=True)
    for node in nodes(entities):
        on_exit = node.kwargs["on_exit"]
        (on_io,) = [h.args[0] for h in handlers if h.args[0].kwargs["target_action"] is node]
        assert type(on_io).__name__ == "OnProcessIO" and set(on_io.kwargs) == {"target_action", "on_stderr"}
        (shutdown,) = on_exit(_exited(0), running)
        assert type(shutdown).__name__ == "Shutdown" and "exited with status 0" in shutdown.kwargs["reason"]
        # stderr arrives in chunks of bytes, several lines at a time
        on_io.kwargs["on_stderr"](types.SimpleNamespace(text=b"12:00:00 INFO loading\n"))
        with pytest.raises(NodeProcessFailed) as failed:
            on_exit(_exited(2), running)
        assert str(failed.value).endswith("exited with status 2: 12:00:00 INFO loading")
        on_io.kwargs["on_stderr"](
            types.SimpleNamespace(text=b"mstar_x: error: FileNotFoundError: /w: no config.json\n\n")
        )
        with pytest.raises(
            NodeProcessFailed,
            match=f"\\({node.kwargs['executable']}\\) exited with status -11: "
            "mstar_x: error: FileNotFoundError: /w: no config.json$",
        ):
            on_exit(_exited(-11), running)
        assert on_exit(_exited(-2), stopping) is None and on_exit(_exited(0), stopping) is None


def test_prompt_and_status_every_reach_the_node_set_command():
    (p,) = pi05_processes(prompt="-- pick it up", status_every="2.5")
    assert p.arguments[-3:] == ("--prompt=-- pick it up", "--status-every", "2.5")
    (p,) = pi05_processes(prompt="  ", status_every="0")
    assert not any(a.startswith(("--prompt", "--status-every")) for a in p.arguments)
    for bad, says in [(dict(status_every="often"), "expected seconds"), (dict(status_every="-1"), ">= 0")]:
        with pytest.raises(ValueError, match=says):
            pi05_processes(**bad)
    from mstar_ros.ros.pi05.node_set import parse_args  # the node set takes what the spec gives it

    args, ros_args = parse_args(list(pi05_processes(prompt="-- pick it up", status_every="2.5")[0].arguments))
    assert args.prompt == "-- pick it up" and args.status_every == 2.5


def test_mstar_ros_launch_passes_prompt_and_status_every_through(capsys):
    from mstar_ros.cli import main

    assert (
        main(
            [
                "launch",
                "pi05",
                "--robots",
                "/r1",
                "--prompt",
                "open the drawer",
                "--status-every",
                "3",
                "--print-commands",
            ]
        )
        == 0
    )
    (command,) = capsys.readouterr().out.splitlines()
    assert command.startswith(
        "mstar_pi05_node_set --robots /r1 --prompt=open the drawer --status-every 3.0 --ros-args --params-file "
    ), command
    assert main(["launch", "pi05", "--status-every", "soon", "--print-commands"]) == 2
    assert "status_every: expected seconds" in capsys.readouterr().err


def test_tokenizer_and_asset_id_reach_the_node_set(tmp_path, capsys):
    from mstar_ros.cli import main
    from mstar_ros.ros.pi05.node_set import parse_args

    tok = tmp_path / "paligemma_tokenizer.model"
    tok.write_bytes(b"x")
    (p,) = pi05_processes(tokenizer=str(tok), asset_id="physical-intelligence/libero")
    args, _ = parse_args(list(p.arguments))
    assert (args.tokenizer, args.asset_id) == (str(tok), "physical-intelligence/libero")
    with pytest.raises(FileNotFoundError, match="tokenizer: no file or directory"):
        pi05_processes(tokenizer=str(tmp_path / "none"))
    assert main(["launch", "pi05", "--tokenizer", str(tok), "--asset-id", "droid", "--print-commands"]) == 0
    assert f"--tokenizer {tok} --asset-id=droid" in capsys.readouterr().out


def test_the_dtype_launch_argument_reaches_every_node_set(capsys):
    from mstar_ros.cli import main
    from mstar_ros.ros.orpheus import node_set as orpheus_node_set
    from mstar_ros.ros.pi05 import node_set as pi05_node_set
    from mstar_ros.ros.vjepa2 import node_set as vjepa2_node_set

    for processes, parse in (
        (pi05_processes, pi05_node_set.parse_args),
        (vjepa2_processes, vjepa2_node_set.parse_args),
        (orpheus_processes, orpheus_node_set.parse_args),
    ):
        for spec in processes(dtype="float32"):
            args, _ = parse(list(spec.arguments))
            assert args.dtype == "float32"
        for spec in processes():  # auto, the default: nothing passed, the node set's own default is auto
            assert "--dtype" not in spec.arguments and parse(list(spec.arguments))[0].dtype == "auto"
        with pytest.raises(ValueError, match="dtype: expected one of auto, float32, bfloat16, float16, got 'bf16'"):
            processes(dtype="bf16")
    for arguments in (LAUNCH_ARGUMENTS, ORPHEUS_LAUNCH_ARGUMENTS, VJEPA2_LAUNCH_ARGUMENTS):
        assert {a.name: a.default for a in arguments}["dtype"] == "auto"  # ros2 launch ... dtype:=float32
    assert main(["launch", "vjepa2", "--dtype", "bfloat16", "--print-commands"]) == 0
    assert "--dtype bfloat16" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # argparse names the choices
        main(["launch", "orpheus", "--dtype", "bf16", "--print-commands"])
    assert exit_.value.code == 2 and "invalid choice: 'bf16'" in capsys.readouterr().err


# -- `mstar-ros launch pi05` for real: remapping and parameters reach the nodes -----------------------


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_mstar_ros_launch_applies_ros_args_remapping_and_parameters(
    procs, start_player, short_bag, ros_client, tmp_path
):
    from trajectory_msgs.msg import JointTrajectory

    params = tmp_path / "params.yaml"  # a params file of our own: the -p after it wins over it
    config = yaml.safe_load(default_params_file().read_text())
    config["/**"]["ros__parameters"]["control_rate_hz"] = 12.0
    params.write_text(yaml.safe_dump(config))
    ros_client.subscribe(JointTrajectory, "/arm_left/trajectory")
    ros_client.subscribe(JointTrajectory, "/robot1/action_chunk")
    summary = tmp_path / "summary.json"
    launcher = procs(
        sys.executable,
        "-m",
        "mstar_ros.cli",
        "launch",
        "pi05",
        "--robots",
        "/robot1",
        "--params-file",
        str(params),
        "--summary-json",
        str(summary),
        "--status-every",
        "1",
        "--ros-args",
        "-r",
        "/robot1/action_chunk:=/arm_left/trajectory",
        "-p",
        "control_rate_hz:=20.0",
        "-p",
        "prompt:=stack the red block",
    )
    player = start_player(short_bag, "--topics", "/robot1")
    ros_client.wait_for(
        lambda: len(ros_client.got("/arm_left/trajectory")) >= 2,
        90,
        "2 chunks on the remapped topic",
        [launcher, player],
    )
    # the prompt parameter can be changed while serving (as `ros2 param set` does), never to ""
    assert [r.successful for r in _set_param(ros_client, "/robot1/pi05_policy", "prompt", "   ")] == [False]
    assert [r.successful for r in _set_param(ros_client, "/robot1/pi05_policy", "prompt", "open it")] == [True]
    # the others are read at start: refused, not silently ignored
    (refused,) = _set_param(ros_client, "/robot1/pi05_policy", "on_sensor_loss", "continue")
    assert not refused.successful and "read at start" in refused.reason
    assert launcher.interrupt() == 0, launcher.output  # Ctrl-C stops the node set it started
    player.interrupt()
    assert "[launch] pi05_node_set exited with status 0" in launcher.output
    assert "status after" in launcher.output  # --status-every 1 reached the node set
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


@pytest.mark.timeout(60)
def test_mstar_ros_launch_ends_with_the_failed_node_sets_status_and_one_line_error(procs, tmp_path):
    """Like the launch files: the node set fails (a bad weights path) -> the group ends with its status
    (2) and its one-line error, named; no traceback."""
    launcher = procs(
        sys.executable, "-m", "mstar_ros.cli", "launch", "pi05", "--weights", str(tmp_path / "none"), "--duration", "30"
    )
    assert launcher.proc.wait(timeout=50) == 2, launcher.output
    launcher._reader.join(timeout=5)
    said = f"mstar_pi05_node_set: error: FileNotFoundError: {tmp_path / 'none'}: no such directory"
    assert launcher.lines[-1].startswith(
        f"mstar-ros launch: error: pi05_node_set (mstar_pi05_node_set) exited with status 2: {said}"
    ), launcher.output
    assert "[launch] pi05_node_set exited with status 2" in launcher.output and "Traceback" not in launcher.output
