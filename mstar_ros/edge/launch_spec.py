"""The edge box's processes (``mstar-ros launch edge``, ``ros2 launch mstar_ros edge.launch.py``), from its config.

One :class:`~mstar_ros.launch_spec.ProcessSpec` per process group of the edge config
(mstar_ros.edge.config): ``mstar_edge_host --config FILE --process NAME``, which runs that group's
front-ends (pi0.5 robots, the voice gateway, BAGEL images) in one process on one device thread. The
config is checked here first, so a bad file fails the launch before any process starts, with the
file, line and field.
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
)

EDGE_CONFIG_FILE = "edge.yaml"
EXECUTABLE = "mstar_edge_host"
MODULE = "mstar_ros.edge.host"

#: ``ros2 launch mstar_ros edge.launch.py NAME:=VALUE`` / ``mstar-ros launch edge --NAME VALUE``
EDGE_LAUNCH_ARGUMENTS = (
    LaunchArgument(
        "config",
        "",
        f"the edge config: front-ends grouped into processes, intra-op threads of each (empty: "
        f"config/{EDGE_CONFIG_FILE} as installed)",
    ),
    LaunchArgument(
        "status_every", "0", "each process with robots prints their chunks and latency every this many seconds"
    ),
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
)


def default_edge_config() -> Path:
    return required_config(EDGE_CONFIG_FILE, "config")


def edge_processes(
    config: str = "",
    status_every: str | float = "0",
    dtype: str = "auto",
    use_sim_time: str | bool = "false",
    *,
    cores: int | None = None,
    summary_json: str = "",
    extra_arguments: Sequence[str] = (),
    ros_arguments: Sequence[str] = (),
) -> list[ProcessSpec]:
    """One process per process group of the edge config (checked: EdgeConfigError naming the line and field).
    ``cores``: the machine's (default: this process's CPU affinity), for the threads check. ``summary_json``:
    where each process writes its summary (with several processes, FILE_STEM-NAME.json per process)."""
    from mstar_ros.edge.config import load_edge_config
    from mstar_ros.edge.engine_settings import check_engine_configs

    path = Path(config).resolve() if config else default_edge_config()
    edge = load_edge_config(path, cores=cores)
    check_engine_configs(edge)  # before any process starts (imports torch only if one is set)
    args = list(_dtype_arguments(dtype))
    if str(status_every) not in ("", "0"):
        try:
            every = float(status_every)
        except ValueError:
            raise ValueError(f"status_every: expected seconds, got {status_every!r}") from None
        if not every >= 0:
            raise ValueError(f"status_every: must be >= 0, got {status_every!r}")
        args += ["--status-every", repr(every)] if every else []
    groups = edge.config.processes
    return [
        ProcessSpec(
            name=f"edge_{group.name}",
            executable=EXECUTABLE,
            module=MODULE,
            arguments=(
                *("--config", str(path), "--process", group.name, *args),
                *_summary_arguments(summary_json, group.name, len(groups) > 1),
                *extra_arguments,
            ),
            # ROS nodes only where the group has robots: a gateway alone runs no rclpy
            parameters=_sim_time_parameters(use_sim_time) if group.pi05 else (),
            ros_arguments=tuple(ros_arguments) if group.pi05 else (),
        )
        for group in groups
    ]


def _summary_arguments(summary_json: str, name: str, several: bool) -> list[str]:
    if not summary_json:
        return []
    path = Path(summary_json)
    return ["--summary-json", str(path.with_name(f"{path.stem}-{name}{path.suffix}") if several else path)]
