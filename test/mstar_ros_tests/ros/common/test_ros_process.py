"""The command-line split every mstar node makes: its own arguments, then rclpy's ``--ros-args`` tail."""

from __future__ import annotations

from mstar_ros.ros.common.ros_process import split_ros_args


def test_split_ros_args():
    assert split_ros_args(["--robots", "/a"]) == (["--robots", "/a"], [])
    ours, ros = split_ros_args(["--partition", "talker", "--ros-args", "-r", "text:=in", "-p", "voice:=leo"])
    assert ours == ["--partition", "talker"] and ros == ["--ros-args", "-r", "text:=in", "-p", "voice:=leo"]
    assert split_ros_args(["--ros-args"]) == ([], ["--ros-args"])


def test_a_worker_that_failed_setup_is_said_in_one_line_with_status_2(capsys):
    from mstar.conductor import WorkerSetupError
    from mstar_ros.ros.common.ros_process import run_serving

    async def serving() -> dict:
        raise WorkerSetupError(1, "WeightsError: cannot read safetensors file /w/model.safetensors: truncated")

    assert run_serving("prog", serving()) == (2, None)
    assert capsys.readouterr().err == (
        "prog: error: WeightsError: cannot read safetensors file /w/model.safetensors: truncated (worker rank 1)\n"
    )
