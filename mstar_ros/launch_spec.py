"""One source of truth for the node sets (pi0.5; Orpheus TTS; V-JEPA 2-AC): their processes, from the launch arguments.

``launch/pi05.launch.py`` (``ros2 launch mstar_ros pi05.launch.py robots:='/robot1 /robot2'``)
turns each :class:`ProcessSpec` into a ``launch_ros.actions.Node``; ``mstar-ros launch pi05``
(where the ROS 2 launch tools are not installed: they are not on PyPI) starts the same
commands as subprocesses. Today the node set is one process: the ``mstar_pi05_node_set``
executable hosting the Conductor, ``/mstar/conductor`` and one ``pi05_policy`` node per robot.

The command line is laid out as launch_ros lays out a Node's::

    EXECUTABLE ARGUMENTS... --ros-args --params-file PARAMS_FILE [-r FROM:=TO ...] [USER ROS ARGS]

so ``ProcessSpec.command()`` is what ``ros2 launch`` runs, and arguments a user adds after
``--ros-args`` come last and win (rcl applies parameters and remappings in order).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mstar.engine.dtype_names import DTYPE_NAMES
from mstar_ros.config_files import required_config

PARAMS_FILE = "pi05.yaml"


@dataclass(frozen=True)
class LaunchArgument:
    name: str
    default: str
    description: str


DTYPE_ARGUMENT = LaunchArgument(
    "dtype",
    "auto",
    f"compute dtype: {', '.join(DTYPE_NAMES)} (auto: the fastest this "
    "machine runs natively -- bfloat16 with AVX512-BF16/AMX or a bf16 GPU, "
    "float32 where bf16 would be emulated; logged with its reason)",
)


USE_SIM_TIME_ARGUMENT = LaunchArgument(
    "use_sim_time",
    "false",
    "true: every node of the set keeps time by the "
    "/clock topic (a bag replayed with `mstar-ros bag play --clock` or `ros2 bag play "
    "--clock`), so recorded stamps are judged against the recording's time",
)


def _flag(name: str, text: str | bool) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"{name}: expected true or false, got {text!r}")
    return value in ("true", "1", "yes")


def _sim_time_parameters(use_sim_time: str | bool) -> tuple[tuple[str, bool], ...]:
    """``use_sim_time`` for every node of a process (rclpy's own parameter: its clock follows /clock)."""
    return (("use_sim_time", True),) if _flag("use_sim_time", use_sim_time) else ()


def _dtype_arguments(dtype: str) -> list[str]:
    """``--dtype NAME`` for a node set (nothing for auto, its default); an unknown name is an error."""
    if dtype not in ("", *DTYPE_NAMES):
        raise ValueError(f"dtype: expected one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    return ["--dtype", dtype] if dtype not in ("", "auto") else []


#: ``ros2 launch mstar_ros pi05.launch.py NAME:=VALUE`` / ``mstar-ros launch pi05 --NAME VALUE``
LAUNCH_ARGUMENTS = (
    LaunchArgument("robots", "/robot1", "robot namespaces, separated by spaces or commas"),
    LaunchArgument(
        "weights", "", "pi0.5 PyTorch checkpoint directory (empty: a generated tiny checkpoint with RANDOM weights)"
    ),
    LaunchArgument(
        "placement", "", "placement YAML: the model's nodes in Worker processes (empty: all in the node set's process)"
    ),
    LaunchArgument(
        "rate",
        "",
        "control rate in Hz for every robot, over the params file (empty: control_rate_hz from the params file)",
    ),
    LaunchArgument(
        "max_inflight",
        "0",
        "at most this many robots' chunks in flight at once (0: no limit): "
        "bounds sensor-to-action latency under load, batching fewer robots",
    ),
    LaunchArgument(
        "params_file", "", f"ROS params file for the policy nodes (empty: config/{PARAMS_FILE} as installed)"
    ),
    LaunchArgument(
        "prompt",
        "",
        "task prompt for every robot, over the params file (empty: the params file's "
        "prompt; NS/prompt changes it while serving)",
    ),
    LaunchArgument(
        "status_every", "0", "print a status line (chunks, latency per robot) every this many seconds (0: never)"
    ),
    LaunchArgument(
        "tokenizer",
        "",
        "PaliGemma tokenizer file or directory (empty: looked for in the checkpoint, then in openpi's download cache)",
    ),
    LaunchArgument("asset_id", "", "openpi checkpoints: which assets/<asset_id>/norm_stats.json (empty: the only one)"),
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
)


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # label for output and errors
    executable: str  # in <prefix>/lib/mstar_ros/ (launch_ros) and on PATH
    module: str  # the same program as ``python -m MODULE``
    arguments: tuple[str, ...] = ()
    params_files: tuple[str, ...] = ()
    parameters: tuple[tuple[str, bool], ...] = ()  # ROS parameters of every node, over the params files
    remappings: tuple[tuple[str, str], ...] = ()
    ros_arguments: tuple[str, ...] = ()  # a user's own, after everything else

    def ros_args(self) -> list[str]:
        out = []
        for path in self.params_files:
            out += ["--params-file", path]
        for name, value in self.parameters:
            out += ["-p", f"{name}:={str(value).lower()}"]  # YAML's true / false
        for src, dst in self.remappings:
            out += ["-r", f"{src}:={dst}"]
        out += self.ros_arguments
        return ["--ros-args", *out] if out else []  # none for a process that is no ROS node

    def command(self, python: str | None = None) -> list[str]:
        """The command line; with ``python``, run as ``python -m MODULE`` (no PATH lookup)."""
        head = [python, "-m", self.module] if python else [self.executable]
        return head + list(self.arguments) + self.ros_args()


def parse_robots(text: str | Sequence[str]) -> list[str]:
    """'/robot1 /robot2', 'robot1,robot2' or a list -> ['/robot1', '/robot2'] (checked ROS namespaces)."""
    items = re.split(r"[\s,]+", text) if isinstance(text, str) else [r for t in text for r in re.split(r"[\s,]+", t)]
    robots = ["/" + r.strip("/") for r in items if r.strip("/")]
    if not robots:
        raise ValueError("robots: give at least one robot namespace, e.g. /robot1")
    for ns in robots:
        if not re.fullmatch(r"(/[A-Za-z][A-Za-z0-9_]*)+", ns):
            raise ValueError(
                f"robots: {ns!r} is not a valid ROS namespace (letters, digits, _; parts start with a letter)"
            )
    if len(set(robots)) != len(robots):
        raise ValueError(f"robots: {robots} names a namespace twice")
    return robots


def default_params_file() -> Path:
    """config/pi05.yaml: the source tree's, else the installed share/mstar_ros/config/ one."""
    return required_config(PARAMS_FILE, "params_file")


def pi05_processes(
    robots: str | Sequence[str] = "/robot1",
    weights: str = "",
    placement: str = "",
    rate: str | float = "",
    params_file: str = "",
    max_inflight: str | int = "0",
    prompt: str = "",
    status_every: str | float = "0",
    tokenizer: str = "",
    asset_id: str = "",
    dtype: str = "auto",
    use_sim_time: str | bool = "false",
    *,
    extra_arguments: Sequence[str] = (),
    remappings: Sequence[tuple[str, str]] = (),
    ros_arguments: Sequence[str] = (),
) -> list[ProcessSpec]:
    """The pi0.5 node set's processes. Launch arguments come as strings (empty = default);
    ``extra_arguments`` go to the node set (e.g. ``--duration 20``), ``ros_arguments`` after
    its ROS arguments."""
    args = ["--robots", *parse_robots(robots)]
    if weights:
        args += ["--weights", str(weights)]
    if placement:
        if not Path(placement).is_file():
            raise FileNotFoundError(f"placement: no file {placement}")
        args += ["--placement", str(placement)]
    if rate not in ("", None):
        try:
            hz = float(rate)
        except ValueError:
            raise ValueError(f"rate: expected Hz, got {rate!r}") from None
        if not hz > 0:
            raise ValueError(f"rate: must be > 0, got {rate!r}")
        args += ["--rate", repr(hz)]
    if str(max_inflight) not in ("", "0"):
        if not str(max_inflight).isdigit():
            raise ValueError(f"max_inflight: expected a count >= 0, got {max_inflight!r}")
        args += ["--max-inflight", str(int(max_inflight))]
    if str(prompt).strip():
        args += [f"--prompt={prompt}"]  # one word, even for a prompt that starts with '-'
    if str(status_every) not in ("", "0"):
        try:
            every = float(status_every)
        except ValueError:
            raise ValueError(f"status_every: expected seconds, got {status_every!r}") from None
        if not every >= 0:
            raise ValueError(f"status_every: must be >= 0, got {status_every!r}")
        if every > 0:
            args += ["--status-every", repr(every)]
    if tokenizer:
        if not Path(tokenizer).exists():
            raise FileNotFoundError(f"tokenizer: no file or directory {tokenizer}")
        args += ["--tokenizer", str(tokenizer)]
    if asset_id:
        args += [f"--asset-id={asset_id}"]
    args += _dtype_arguments(dtype)
    params = Path(params_file) if params_file else default_params_file()
    if not params.is_file():
        raise FileNotFoundError(f"params_file: no file {params}")
    return [
        ProcessSpec(
            name="pi05_node_set",
            executable="mstar_pi05_node_set",
            module="mstar_ros.ros.pi05.node_set",
            arguments=tuple(args) + tuple(extra_arguments),
            params_files=(str(params),),
            parameters=_sim_time_parameters(use_sim_time),
            remappings=tuple((str(a), str(b)) for a, b in remappings),
            ros_arguments=tuple(ros_arguments),
        )
    ]


#: ``ros2 launch mstar_ros orpheus.launch.py NAME:=VALUE`` / ``mstar-ros launch orpheus --NAME VALUE``
ORPHEUS_LAUNCH_ARGUMENTS = (
    LaunchArgument(
        "split",
        "true",
        "true: the talker (LLM) and vocoder (SNAC) partitions as two nodes in two "
        "processes, joined by the llm_token topic; false: one node",
    ),
    LaunchArgument("namespace", "/tts", "ROS namespace of the nodes and their topics"),
    LaunchArgument(
        "weights", "", "Orpheus checkpoint directory (empty: a generated tiny checkpoint with RANDOM weights)"
    ),
    LaunchArgument("snac_weights", "", "SNAC 24 kHz checkpoint directory (empty: WEIGHTS/snac)"),
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
)


def orpheus_processes(
    split: str | bool = "true",
    namespace: str = "/tts",
    weights: str = "",
    snac_weights: str = "",
    dtype: str = "auto",
    use_sim_time: str | bool = "false",
    *,
    extra_arguments: Sequence[str] = (),
    ros_arguments: Sequence[str] = (),
) -> list[ProcessSpec]:
    """Orpheus TTS as ROS nodes (mstar_ros.ros.orpheus.node_set): one per partition when ``split``."""
    try:
        (ns,) = parse_robots(namespace)  # the same rules as any namespace
    except ValueError as exc:
        raise ValueError(str(exc).replace("robots:", "namespace:", 1)) from None
    args = ["--namespace", ns]
    for flag, path in (("--weights", weights), ("--snac-weights", snac_weights)):
        if path:
            if not Path(path).is_dir():
                raise FileNotFoundError(f"{flag.lstrip('-').replace('-', '_')}: no directory {path}")
            args += [flag, str(path)]
    args += _dtype_arguments(dtype)
    partitions = ["talker", "vocoder"] if _flag("split", split) else ["all"]
    return [
        ProcessSpec(
            name="orpheus" if part == "all" else f"orpheus_{part}",
            executable="mstar_orpheus_node",
            module="mstar_ros.ros.orpheus.node_set",
            arguments=("--partition", part, *args, *extra_arguments),
            parameters=_sim_time_parameters(use_sim_time),
            ros_arguments=tuple(ros_arguments),
        )
        for part in partitions
    ]


#: ``ros2 launch mstar_ros vjepa2.launch.py NAME:=VALUE`` / ``mstar-ros launch vjepa2 --NAME VALUE``
VJEPA2_PARAMS_FILE = "vjepa2.yaml"
VJEPA2_LAUNCH_ARGUMENTS = (
    LaunchArgument("robots", "/robot1", "robot namespaces, separated by spaces or commas"),
    LaunchArgument(
        "weights",
        "",
        "Meta's vjepa2-ac-vitg.pt or a checkpoint directory (empty: a generated tiny checkpoint with RANDOM weights)",
    ),
    LaunchArgument(
        "params_file",
        "",
        f"ROS params file for the world-model nodes (empty: config/{VJEPA2_PARAMS_FILE} as installed)",
    ),
    DTYPE_ARGUMENT,
    USE_SIM_TIME_ARGUMENT,
)


def vjepa2_processes(
    robots: str | Sequence[str] = "/robot1",
    weights: str = "",
    params_file: str = "",
    dtype: str = "auto",
    use_sim_time: str | bool = "false",
    *,
    extra_arguments: Sequence[str] = (),
    ros_arguments: Sequence[str] = (),
) -> list[ProcessSpec]:
    """The V-JEPA 2-AC node set's process (mstar_ros.ros.vjepa2.node_set)."""
    args = ["--robots", *parse_robots(robots)]
    if weights:
        if not Path(weights).exists():
            raise FileNotFoundError(f"weights: no file or directory {weights}")
        args += ["--weights", str(weights)]
    args += _dtype_arguments(dtype)
    if params_file:
        params = Path(params_file)
    else:
        params = required_config(VJEPA2_PARAMS_FILE, "params_file")
    if not params.is_file():
        raise FileNotFoundError(f"params_file: no file {params}")
    return [
        ProcessSpec(
            name="vjepa2_node_set",
            executable="mstar_vjepa2_node_set",
            module="mstar_ros.ros.vjepa2.node_set",
            arguments=tuple(args) + tuple(extra_arguments),
            params_files=(str(params),),
            parameters=_sim_time_parameters(use_sim_time),
            ros_arguments=tuple(ros_arguments),
        )
    ]
