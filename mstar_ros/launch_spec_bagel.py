"""The BAGEL node set's processes, alone and beside the V-JEPA 2-AC node set, from the launch arguments.

``launch/bagel.launch.py`` (``ros2 launch mstar_ros bagel.launch.py``) starts :func:`bagel_processes`;
``launch/bagel_vjepa2.launch.py`` starts :func:`bagel_vjepa2_processes`: BAGEL imagines the goal (the
camera's frame edited by an instruction, published on NS/goal_image) and the world model of the same
namespace plans toward it. Laid out as mstar_ros.launch_spec lays out the other node sets (one
ProcessSpec per process; arguments a user adds after ``--ros-args`` come last and win).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mstar_ros.config_files import required_config
from mstar_ros.launch_spec import (
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
    LaunchArgument,
    ProcessSpec,
    _dtype_arguments,
    _sim_time_parameters,
    parse_robots,
    vjepa2_processes,
)

BAGEL_PARAMS_FILE = "bagel.yaml"

_WEIGHTS = "BAGEL-7B-MoT checkpoint directory (empty: a generated tiny checkpoint with RANDOM weights)"
_PARAMS = f"ROS params file for the BAGEL nodes (empty: config/{BAGEL_PARAMS_FILE} as installed)"

#: ``ros2 launch mstar_ros bagel.launch.py NAME:=VALUE``
BAGEL_LAUNCH_ARGUMENTS = (
    LaunchArgument("robots", "/robot1", "namespaces, one BAGEL node each, separated by spaces or commas"),
    LaunchArgument("weights", "", _WEIGHTS),
    LaunchArgument(
        "placement", "", "placement YAML: the model in Worker processes (empty: all in the node set's process)"
    ),
    LaunchArgument("params_file", "", _PARAMS),
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
)

#: ``ros2 launch mstar_ros bagel_vjepa2.launch.py NAME:=VALUE``
BAGEL_VJEPA2_LAUNCH_ARGUMENTS = (
    LaunchArgument("robots", "/robot1", "robot namespaces (a BAGEL node and a world model each)"),
    LaunchArgument("bagel_weights", "", _WEIGHTS),
    LaunchArgument(
        "vjepa2_weights",
        "",
        "Meta's vjepa2-ac-vitg.pt or a checkpoint directory (empty: a generated tiny checkpoint with RANDOM weights)",
    ),
    LaunchArgument("bagel_params_file", "", _PARAMS),
    LaunchArgument(
        "vjepa2_params_file", "", "ROS params file for the world-model nodes (empty: config/vjepa2.yaml as installed)"
    ),
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
)


def _bagel_params_file(params_file: str) -> Path:
    if params_file:
        params = Path(params_file)
    else:
        params = required_config(BAGEL_PARAMS_FILE, "params_file")
    if not params.is_file():
        raise FileNotFoundError(f"params_file: no file {params}")
    return params


def bagel_processes(
    robots: str | Sequence[str] = "/robot1",
    weights: str = "",
    placement: str = "",
    params_file: str = "",
    dtype: str = "auto",
    use_sim_time: str | bool = "false",
    *,
    extra_arguments: Sequence[str] = (),
    ros_arguments: Sequence[str] = (),
) -> list[ProcessSpec]:
    """The BAGEL node set's process (mstar_ros.ros.bagel.node_set). Launch arguments come as strings
    (empty = default)."""
    args = ["--robots", *parse_robots(robots)]
    if weights:
        if not Path(weights).is_dir():
            raise FileNotFoundError(f"weights: no directory {weights}")
        args += ["--weights", str(weights)]
    if placement:
        if not Path(placement).is_file():
            raise FileNotFoundError(f"placement: no file {placement}")
        args += ["--placement", str(placement)]
    args += _dtype_arguments(dtype)
    return [
        ProcessSpec(
            name="bagel_node_set",
            executable="mstar_bagel_node_set",
            module="mstar_ros.ros.bagel.node_set",
            arguments=tuple(args) + tuple(extra_arguments),
            params_files=(str(_bagel_params_file(params_file)),),
            parameters=_sim_time_parameters(use_sim_time),
            ros_arguments=tuple(ros_arguments),
        )
    ]


def bagel_vjepa2_processes(
    robots: str | Sequence[str] = "/robot1",
    bagel_weights: str = "",
    vjepa2_weights: str = "",
    bagel_params_file: str = "",
    vjepa2_params_file: str = "",
    dtype: str = "auto",
    use_sim_time: str | bool = "false",
    *,
    bagel_extra_arguments: Sequence[str] = (),
    vjepa2_extra_arguments: Sequence[str] = (),
    bagel_ros_arguments: Sequence[str] = (),
    vjepa2_ros_arguments: Sequence[str] = (),
) -> list[ProcessSpec]:
    """BAGEL and V-JEPA 2-AC node sets over the same namespaces: each BAGEL node publishes its goal images on
    the topic its namespace's world model reads its goal from (both default to NS/goal_image)."""
    return bagel_processes(
        robots,
        bagel_weights,
        "",
        bagel_params_file,
        dtype,
        use_sim_time,
        extra_arguments=bagel_extra_arguments,
        ros_arguments=bagel_ros_arguments,
    ) + vjepa2_processes(
        robots,
        vjepa2_weights,
        vjepa2_params_file,
        dtype,
        use_sim_time,
        extra_arguments=vjepa2_extra_arguments,
        ros_arguments=vjepa2_ros_arguments,
    )
