"""The placement file: which ranks and devices run which nodes (optionally per Walk).

    world_size: 2
    devices: {0: cpu, 1: cpu}        # optional; default cpu for every rank
    node_groups:
      - nodes: [llm]
        ranks: [0]
        walks: [prefill]             # optional: only for these Walks (default: every Walk)
      - nodes: [llm]
        ranks: [1]
        walks: [decode]
      - nodes: [snac]
        ranks: [1]
        tp_size: 1                   # optional; ranks must number tp_size
        quantization: int8           # optional: none | int8 | int4 | int8_dynamic | fp16 (default: the engine config's)
    transport:                       # optional; how tensors cross between Workers
      default: auto                  # auto: shm on one host, tcp across hosts
      edges: {llm.token: tcp}        # per producing endpoint
    skip_walks: [image_gen_cfg]      # optional: Walks this placement does not serve (their nodes need
                                     # no rank; a request that reaches one fails naming it)
    priorities: {decode: batch}      # optional: priority class (control, interactive, batch) of the
                                     # calls of a node or walk, over the request's own (mstar.priority)
    class_limits: {batch: 1}         # optional: requests of a class in flight at once (more wait)

Parsed with a msgspec schema; every error names the field and the line of the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from mstar.layers.weight_only import QUANTIZATIONS
from mstar.priority import Priority
from mstar.user_yaml import UserYamlError, parse_user_yaml, read_user_yaml_text
from mstar.yaml_lines import YamlLines, field_name, msgspec_path

DEVICE = re.compile(r"^(cpu|cuda:\d+)$")
TRANSPORTS = ("auto", "shm", "tcp", "mooncake")


class PlacementError(ValueError):
    """A placement file that cannot be used; the message names the field and the line."""


class NodeGroup(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    nodes: list[str]
    ranks: list[int]
    walks: list[str] | None = None
    tp_size: int = 1
    quantization: str | None = None  # overrides EngineConfig.quantization for these nodes


class TransportChoice(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    default: str = "auto"
    edges: dict[str, str] = {}  # "node.port" -> transport, for the values that endpoint produces


class Placement(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    world_size: int
    node_groups: list[NodeGroup]
    devices: dict[int, str] = {}
    transport: TransportChoice = TransportChoice()
    skip_walks: list[str] = []
    priorities: dict[str, str] = {}  # node or walk name -> class name (mstar.priority)
    # class name -> requests of that class in flight at once (any value here, checked with its line below)
    class_limits: dict[str, Any] = {}

    def device_of(self, rank: int) -> str:
        return self.devices.get(rank, "cpu")


class PlacementFile:
    """A parsed placement plus where each part came from, for errors that point at a line."""

    def __init__(self, placement: Placement, source: str, lines: YamlLines) -> None:
        self.placement = placement
        self.source = source
        self._lines = lines

    def error(self, path: tuple, message: str) -> PlacementError:
        line = self._lines.at(path)
        where = f"{self.source}:{line}" if line else self.source
        return PlacementError(f"{where}: {field_name(path)}: {message}")

    @classmethod
    def parse(cls, text: str, source: str = "<placement>") -> PlacementFile:
        try:
            root, data = parse_user_yaml(text, source)
        except UserYamlError as exc:
            raise PlacementError(str(exc)) from None
        lines = YamlLines(root)
        if not isinstance(data, dict):
            raise PlacementError(f"{source}: expected a mapping with world_size and node_groups")
        try:
            placement = msgspec.convert(data, Placement)
        except msgspec.ValidationError as exc:
            path = msgspec_path(str(exc))
            line = lines.at(path)
            where = f"{source}:{line}" if line else source
            raise PlacementError(f"{where}: {exc}") from None
        parsed = cls(placement, source, lines)
        parsed._check_shape()
        return parsed

    @classmethod
    def load(cls, path: str | Path) -> PlacementFile:
        try:
            text = read_user_yaml_text(path)
        except UserYamlError as exc:
            raise PlacementError(str(exc)) from None
        return cls.parse(text, str(path))

    def _check_shape(self) -> None:
        p = self.placement
        if p.world_size < 1:
            raise self.error(("world_size",), f"must be >= 1, got {p.world_size}")
        for rank, device in p.devices.items():
            if not 0 <= rank < p.world_size:
                raise self.error(("devices", rank), f"rank {rank} is out of range (world_size {p.world_size})")
            if not DEVICE.match(device):
                raise self.error(("devices", rank), f"device {device!r} is not 'cpu' or 'cuda:N'")
        for i, group in enumerate(p.node_groups):
            if not group.nodes:
                raise self.error(("node_groups", i, "nodes"), "names no node")
            if not group.ranks:
                raise self.error(("node_groups", i, "ranks"), "names no rank")
            for j, rank in enumerate(group.ranks):
                if not 0 <= rank < p.world_size:
                    raise self.error(
                        ("node_groups", i, "ranks", j), f"rank {rank} is out of range (world_size {p.world_size})"
                    )
            if len(set(group.ranks)) != len(group.ranks):
                raise self.error(("node_groups", i, "ranks"), f"names a rank twice: {group.ranks}")
            if group.tp_size < 1 or len(group.ranks) != group.tp_size:
                raise self.error(
                    ("node_groups", i, "tp_size"),
                    f"tp_size {group.tp_size} needs exactly that many ranks, got {group.ranks}",
                )
            if group.quantization is not None and group.quantization not in QUANTIZATIONS:
                raise self.error(
                    ("node_groups", i, "quantization"),
                    f"unknown quantization {group.quantization!r} (one of {list(QUANTIZATIONS)})",
                )
        if p.transport.default not in TRANSPORTS:
            raise self.error(
                ("transport", "default"), f"unknown transport {p.transport.default!r} (one of {list(TRANSPORTS)})"
            )
        for endpoint, kind in p.transport.edges.items():
            if kind not in TRANSPORTS:
                raise self.error(
                    ("transport", "edges", endpoint), f"unknown transport {kind!r} (one of {list(TRANSPORTS)})"
                )
        for name, value in p.priorities.items():
            try:
                Priority.parse(value, "class")
            except ValueError as exc:
                raise self.error(("priorities", name), str(exc)) from None
        for name, limit in p.class_limits.items():
            try:
                Priority.parse(name, "class")
            except ValueError as exc:
                raise self.error(("class_limits", name), str(exc)) from None
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise self.error(("class_limits", name), f"{limit!r} is not an in-flight limit (an integer >= 1)")
