"""Stand-ins for the ROS 2 `launch` / `launch_ros` APIs, to load our launch files where those are not installed.

They are not on PyPI. Each stand-in records how it was built (args, kwargs) in the shapes the
real API takes, so a test can read back what a launch file builds: its declared arguments, the
Nodes its OpaqueFunction returns, their on_exit handlers and the event handlers registered for
them. `launch_ros_command` rebuilds the command line launch_ros runs for such a Node.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


class Recorder:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class LaunchConfiguration(Recorder):
    def perform(self, context) -> str:
        return context.launch_configurations[self.args[0]]


def standin_modules() -> dict[str, types.ModuleType]:
    """``launch``, ``launch.actions``, ``launch.event_handlers``, ``launch.substitutions``, ``launch_ros``,
    ``launch_ros.actions`` with the names our launch files and mstar_ros.launch_actions use."""
    mods = {
        name: types.ModuleType(name)
        for name in (
            "launch",
            "launch.actions",
            "launch.event_handlers",
            "launch.substitutions",
            "launch_ros",
            "launch_ros.actions",
        )
    }
    mods["launch"].LaunchDescription = type("LaunchDescription", (Recorder,), {})
    for name in ("DeclareLaunchArgument", "OpaqueFunction", "RegisterEventHandler", "Shutdown"):
        setattr(mods["launch.actions"], name, type(name, (Recorder,), {}))
    mods["launch.event_handlers"].OnProcessIO = type("OnProcessIO", (Recorder,), {})
    mods["launch.substitutions"].LaunchConfiguration = LaunchConfiguration
    mods["launch_ros.actions"].Node = type("Node", (Recorder,), {})
    return mods


def load_launch_file(path: Path, monkeypatch) -> types.ModuleType:
    """The launch file at ``path``, imported against the stand-ins (monkeypatch undoes it)."""
    for name, mod in standin_modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location(path.name.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def describe(module: types.ModuleType, given: dict[str, str]):
    """(declared arguments, the entities its OpaqueFunction returns for launch arguments ``given``)."""
    (description,) = module.generate_launch_description().args
    declared = [a for a in description if type(a).__name__ == "DeclareLaunchArgument"]
    (opaque,) = [a for a in description if type(a).__name__ == "OpaqueFunction"]
    values = {d.args[0]: given.get(d.args[0], d.kwargs["default_value"]) for d in declared}
    context = types.SimpleNamespace(launch_configurations=values)  # what `ros2 launch ... NAME:=VALUE` gives
    return declared, opaque.kwargs["function"](context)


def nodes(entities) -> list[Recorder]:
    return [e for e in entities if type(e).__name__ == "Node"]


def launch_ros_command(node: Recorder) -> list[str]:
    """The command launch_ros.actions.Node runs (no name, namespace or ros_arguments given):
    executable, arguments, --ros-args, a --params-file per parameters entry, -r per remapping.
    A dict entry launch_ros writes to a parameters file of its own, passed in its place in the
    order; here it is the same parameters as ``-p NAME:=VALUE`` there."""
    kw = node.kwargs
    assert set(kw) <= {"package", "executable", "arguments", "parameters", "remappings", "output", "on_exit"}, kw
    cmd = [kw["executable"], *kw.get("arguments", []), "--ros-args"]
    for params in kw.get("parameters", []):
        if isinstance(params, dict):
            assert all(isinstance(v, bool) for v in params.values()), params  # typed, as YAML would read them
            cmd += [arg for name, value in params.items() for arg in ("-p", f"{name}:={str(value).lower()}")]
            continue
        assert isinstance(params, str)
        cmd += ["--params-file", params]
    for src, dst in kw.get("remappings", []):
        cmd += ["-r", f"{src}:={dst}"]
    return cmd
