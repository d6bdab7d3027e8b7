"""The edge box's config (``config/edge.yaml``): which front-ends run, grouped into processes.

    processes:
      - name: box                  # one process: its models share one device thread (class-aware stepping)
        threads: 2                 # its intra-op threads; the sum over processes <= the machine's cores
        scheduling: normal         # idle: Linux SCHED_IDLE, almost nothing while the others want the cores
                                   # (mstar_ros.edge.os_scheduling); its threads are not counted in the sum
        pi05:                      # the pi0.5 policy for these robots (one Conductor)
          robots: [/robot1, /robot2]
          weights: ""              # "": the generated tiny checkpoint (RANDOM weights)
          params_file: ""          # "": config/pi05.yaml
          rate: null               # Hz over the params file's control_rate_hz
          max_inflight: 0
          prompt: ""
          engine_config: ""        # engine settings YAML (config/engine.yaml's fields)
          priority: ""             # "": each request's own class (pi0.5 chunks control, voice interactive,
                                   # image generation batch); a class: every call of this front-end in it
          class_limits: {}         # requests of a class in flight at once on its Conductor ({batch: 1})
        gateway:                   # the voice gateway (WebRTC + OpenAI HTTP), one aiohttp server
          host: 127.0.0.1
          port: 8080
          voice: {model: orpheus}  # /offer, WHIP, /v1/audio/speech (a speech model: orpheus, qwen3-omni)
          images: {model: bagel}   # /v1/images/generations and /edits on the same server (its own Conductor)
          token_file: ""           # Bearer token file (or $MSTAR_GATEWAY_TOKEN); needed off loopback
    oversubscribe: false           # true: allow more threads in all than cores (they slow each other)

Paths are relative to the file. Parsed with a msgspec schema; every error names the file, the line
and the field (``edge.yaml:7: processes[0].threads: ...``). No torch import here: the host reads the
file before torch is imported, to set its intra-op threads.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import msgspec

from mstar.user_yaml import UserYamlError, parse_user_yaml, read_user_yaml_text
from mstar.yaml_lines import YamlLines, field_name, msgspec_path
from mstar_ros.edge.classes import CLASSES, DEFAULT_CLASS
from mstar_ros.edge.os_scheduling import POLICIES
from mstar_ros.launch_spec import parse_robots

NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class EdgeConfigError(ValueError):
    """An edge config that cannot be used; the message names the file, the line and the field."""


class Pi05Front(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    robots: list[str]
    weights: str = ""
    params_file: str = ""
    rate: float | None = None
    max_inflight: int = 0
    prompt: str = ""
    engine_config: str = ""
    priority: str = ""  # "": its requests' own class (control); a class (mstar.priority): all its calls in it
    class_limits: dict[str, Any] = {}  # class -> its requests in flight at once (checked with its line)


class ServedModel(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    model: str
    weights: str = ""
    engine_config: str = ""
    priority: str = ""  # "": each request's own class (voice interactive, images batch); a class: all in it
    class_limits: dict[str, Any] = {}  # class -> its requests in flight at once on this model's Conductor


class GatewayFront(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8080
    voice: ServedModel | None = None
    images: ServedModel | None = None
    max_peers: int = 8
    token_file: str = ""  # Bearer token every endpoint then needs (a host other than loopback needs one)


class ProcessGroup(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    threads: int
    scheduling: str = "normal"  # mstar_ros.edge.os_scheduling.POLICIES
    pi05: Pi05Front | None = None
    gateway: GatewayFront | None = None

    def front_ends(self) -> list[str]:
        """What the process serves, each with its request class: ['pi0.5 for /robot1 [control]', ...]."""
        pi05 = self.pi05
        out = [f"pi0.5 for {' '.join(pi05.robots)} [{pi05.priority or DEFAULT_CLASS['pi05']}]"] if pi05 else []
        for role in ("voice", "images"):
            served = getattr(self.gateway, role, None)
            if served is not None:
                out.append(f"{role} ({served.model}) [{served.priority or DEFAULT_CLASS[role]}]")
        return out


class EdgeConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    processes: list[ProcessGroup]
    oversubscribe: bool = False

    def process(self, name: str) -> ProcessGroup:
        for group in self.processes:
            if group.name == name:
                return group
        raise ValueError(f"no process {name!r} in the edge config (it has: {', '.join(self.names())})")

    def names(self) -> list[str]:
        return [group.name for group in self.processes]


def machine_cores() -> int:
    """The cores this process may run on (its affinity, as a container or taskset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class EdgeFile:
    """A checked edge config plus where it came from: paths in it are relative to its folder."""

    def __init__(self, config: EdgeConfig, source: str, lines: YamlLines) -> None:
        self.config, self.source, self._lines = config, source, lines
        self.folder = Path(source).resolve().parent if not source.startswith("<") else Path.cwd()

    def error(self, path: tuple, message: str) -> EdgeConfigError:
        line = self._lines.at(path)
        where = f"{self.source}:{line}" if line else self.source
        return EdgeConfigError(f"{where}: {field_name(path)}: {message}")

    def path(self, text: str) -> str:
        """A path of the file, absolute ("" stays "": the default)."""
        return str((self.folder / text).resolve()) if text else ""

    @classmethod
    def parse(cls, text: str, source: str = "<edge config>", *, cores: int | None = None) -> EdgeFile:
        try:
            root, data = parse_user_yaml(text, source)
        except UserYamlError as exc:
            raise EdgeConfigError(str(exc)) from None
        lines = YamlLines(root)
        if not isinstance(data, dict):
            raise EdgeConfigError(f"{source}: expected a mapping with processes (a list of process groups)")
        try:
            config = msgspec.convert(data, EdgeConfig)
        except msgspec.ValidationError as exc:
            path, message = msgspec_path(str(exc)), str(exc).split(" - at `")[0]
            unknown = re.search(r"unknown field `(\w+)`", message)
            path += (unknown.group(1),) if unknown else ()  # its own line, not its mapping's
            raise cls(EdgeConfig([]), source, lines).error(path, message) from None
        parsed = cls(config, source, lines)
        parsed._check(machine_cores() if cores is None else cores)
        return parsed

    @classmethod
    def load(cls, path: str | Path, *, cores: int | None = None) -> EdgeFile:
        try:
            text = read_user_yaml_text(path)
        except UserYamlError as exc:
            raise EdgeConfigError(str(exc)) from None
        except OSError as exc:
            raise EdgeConfigError(f"{path}: cannot read the edge config: {exc.strerror}") from None
        return cls.parse(text, str(path), cores=cores)

    def _check(self, cores: int) -> None:
        groups = self.config.processes
        if not groups:
            raise self.error(("processes",), "names no process group")
        seen_names: set[str] = set()
        for i, group in enumerate(groups):
            at = ("processes", i)
            if not NAME.match(group.name):
                raise self.error(at + ("name",), f"{group.name!r} is not a name (lower-case letters, digits, _)")
            if group.name in seen_names:
                raise self.error(at + ("name",), f"process {group.name!r} is named twice")
            seen_names.add(group.name)
            if group.threads < 1:
                raise self.error(at + ("threads",), f"must be >= 1, got {group.threads}")
            if group.scheduling not in POLICIES:
                raise self.error(at + ("scheduling",), f"{group.scheduling!r} is not one of {', '.join(POLICIES)}")
            if group.pi05 is None and group.gateway is None:
                raise self.error(at, "runs no front-end: give pi05 or gateway (or both)")
        self._check_threads(cores)
        self._check_pi05()
        self._check_gateways()

    def _check_threads(self, cores: int) -> None:
        # an idle process gets almost nothing while the others want the cores: its threads are not
        # counted (it still shares caches and memory bandwidth with them: os_scheduling says so)
        counted = [g for g in self.config.processes if g.scheduling != "idle"]
        total = sum(group.threads for group in counted)
        over_one = [g for g in self.config.processes if g.scheduling == "idle" and g.threads > cores]
        if over_one and not self.config.oversubscribe:
            group = over_one[0]
            raise self.error(
                ("processes", self.config.processes.index(group), "threads"),
                f"{group.threads} intra-op threads but this machine has {cores} cores",
            )
        if total > cores and not self.config.oversubscribe:
            each = ", ".join(f"{g.name} {g.threads}" for g in counted)
            raise self.error(
                ("processes",),
                f"{total} intra-op threads in all ({each}) but this machine has {cores} cores: processes "
                "spinning on shared cores slow one another several times over; lower threads, put a batch "
                "group under scheduling: idle, or set oversubscribe: true",
            )

    def _check_pi05(self) -> None:
        owner: dict[str, str] = {}
        for i, group in enumerate(self.config.processes):
            front = group.pi05
            if front is None:
                continue
            at = ("processes", i, "pi05")
            try:
                robots = parse_robots(front.robots)
            except ValueError as exc:
                raise self.error(at + ("robots",), str(exc).removeprefix("robots: ")) from None
            for ns in robots:
                if ns in owner:
                    raise self.error(at + ("robots",), f"{ns} is served by process {owner[ns]!r} already")
                owner[ns] = group.name
            if front.rate is not None and not front.rate > 0:
                raise self.error(at + ("rate",), f"must be > 0 Hz, got {front.rate}")
            if front.max_inflight < 0:
                raise self.error(at + ("max_inflight",), f"must be >= 0 (0: no limit), got {front.max_inflight}")
            self._check_paths(at, front, ("weights", "params_file", "engine_config"))
            if front.priority:
                self._check_class(at, front.priority)
            self._check_limits(at, front.class_limits)

    def _check_gateways(self) -> None:
        from mstar_ros.webrtc.speech_models import speech_model_names

        installed = speech_model_names()
        ports: dict[int, str] = {}
        for i, group in enumerate(self.config.processes):
            gateway = group.gateway
            if gateway is None:
                continue
            at = ("processes", i, "gateway")
            if gateway.voice is None and gateway.images is None:
                raise self.error(at, "serves nothing: give voice, images or both")
            if not 0 <= gateway.port <= 65535:
                raise self.error(at + ("port",), f"{gateway.port} is not a TCP port (0: any free one)")
            if gateway.port and gateway.port in ports:
                raise self.error(at + ("port",), f"port {gateway.port} is taken by process {ports[gateway.port]!r}")
            ports[gateway.port] = group.name
            if gateway.max_peers < 1:
                raise self.error(at + ("max_peers",), f"must be >= 1, got {gateway.max_peers}")
            for role in ("voice", "images"):
                served = getattr(gateway, role)
                if served is None:
                    continue
                if served.model not in installed:
                    raise self.error(
                        at + (role, "model"), f"no model {served.model!r} (installed: {', '.join(installed)})"
                    )
                self._check_paths(at + (role,), served, ("weights", "engine_config"))
                if served.priority:
                    self._check_class(at + (role,), served.priority)
                self._check_limits(at + (role,), served.class_limits)
            self._check_paths(at, gateway, ("token_file",))
            if gateway.voice and gateway.images and gateway.voice.model == gateway.images.model:
                raise self.error(at + ("images", "model"), f"{gateway.images.model} is the voice model already")

    def _check_class(self, at: tuple, name: str) -> None:
        if name not in CLASSES:
            raise self.error(at + ("priority",), f"{name!r} is not a class (one of {', '.join(CLASSES)})")

    def _check_limits(self, at: tuple, limits: dict[str, Any]) -> None:
        for name, limit in limits.items():
            if name not in CLASSES:
                raise self.error(at + ("class_limits", name), f"{name!r} is not a class (one of {', '.join(CLASSES)})")
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise self.error(at + ("class_limits", name), f"{limit!r} is not an in-flight limit (an integer >= 1)")

    def _check_paths(self, at: tuple, front: msgspec.Struct, fields: tuple[str, ...]) -> None:
        for name in fields:
            text = getattr(front, name)
            if text and not Path(self.path(text)).exists():
                raise self.error(at + (name,), f"no file or directory {self.path(text)}")


def load_edge_config(path: str | Path, *, cores: int | None = None) -> EdgeFile:
    """The checked edge config at ``path`` (EdgeConfigError naming the file, line and field)."""
    return EdgeFile.load(path, cores=cores)
