"""The command-line split every mstar node makes: its own arguments, then rclpy's ``--ros-args`` tail."""
from __future__ import annotations

from mstar_ros.ros.ros_process import split_ros_args


def test_split_ros_args():
    assert split_ros_args(["--robots", "/a"]) == (["--robots", "/a"], [])
    ours, ros = split_ros_args(["--partition", "talker", "--ros-args", "-r", "text:=in", "-p", "voice:=leo"])
    assert ours == ["--partition", "talker"] and ros == ["--ros-args", "-r", "text:=in", "-p", "voice:=leo"]
    assert split_ros_args(["--ros-args"]) == ([], ["--ros-args"])
