"""Where each node call goes, and how its outputs must travel to where they are read.

Embedded: every node on the one in-process Worker, handles passed as they are.
Distributed: the placement says which rank runs a node in the current Walk (a
tensor-parallel group is reached through its first rank). Each output port is
exported for its readers: ``inline`` when the Conductor reads it (a graph output the
request wants, the stop edge of a Loop the Conductor iterates), else the transport
towards the other ranks that consume it (shared memory on one host, TCP across
hosts, or what the placement file asks for).
"""

from __future__ import annotations

from typing import Protocol

from mstar.graph.edges import GRAPH_OUTPUT
from mstar.graph.model_graph import ModelGraph
from mstar.graph.walks import Loop, StopOnValues, StopWhen
from mstar.placement.resolve import ResolvedPlacement


class HostLookup(Protocol):
    def host_of(self, rank: int) -> str: ...


def conductor_read_endpoints(graph: ModelGraph) -> set[str]:
    """What the Conductor reads itself: stop edges of the Loops it iterates (engine-resident
    loops stop in the engine), and every output of a Loop body whose StopWhen predicate may
    read any value."""
    out = set()
    for walk in graph.walks.values():
        for step in walk.iter_steps():
            if not isinstance(step, Loop) or graph.engine_resident(step):
                continue
            if isinstance(step.stop, StopOnValues):
                out.add(step.stop.edge)
            elif isinstance(step.stop, StopWhen):
                out.update(f"{n}.{p}" for n in step.body.node_names() for p in graph.node(n).outputs)
    return out


class Router:
    def __init__(self, graph: ModelGraph, placement: ResolvedPlacement | None, hosts: HostLookup | None = None) -> None:
        self.graph = graph
        self.placement = placement
        self.hosts = hosts
        self._read_here = conductor_read_endpoints(graph)
        self._export_cache: dict[tuple[str, int], dict[str, str]] = {}

    @property
    def distributed(self) -> bool:
        return self.placement is not None

    def rank_for(self, node: str, walk: str | None) -> int:
        if self.placement is None:
            return 0
        self.placement.check_served(walk)
        placed = self.placement.lookup(node, walk)
        if placed is None:  # a streamed chunk after its Walk ended: wherever the node is placed
            candidates = self.placement.placements_of(node)
            if not candidates:
                raise KeyError(f"node {node!r} is placed on no rank")
            placed = candidates[0]
        return placed.ranks[0]

    def transport(self, endpoint: str, src: int, dst: int) -> str:
        assert self.placement is not None
        kind = self.placement.transport_for(endpoint)
        if kind != "auto":
            return kind
        if self.hosts is not None and self.hosts.host_of(src) != self.hosts.host_of(dst):
            return "tcp"
        return "shm"

    def exports(self, node: str, rank: int, wanted_outputs: frozenset[str] | set[str] | None) -> dict[str, str]:
        """Per output port of ``node`` running on ``rank``: how to export it (absent: not needed)."""
        if self.placement is None:
            return {}
        key = (node, rank)
        if key not in self._export_cache:
            self._export_cache[key] = self._worker_exports(node, rank)
        exports = dict(self._export_cache[key])
        for port in self.graph.node(node).outputs:
            endpoint = f"{node}.{port}"
            if endpoint in self._read_here:
                exports[port] = "inline"
            for edge in self.graph.edges_from(node, port):
                if edge.target.node == GRAPH_OUTPUT and (wanted_outputs is None or edge.target.port in wanted_outputs):
                    exports[port] = "inline"
        return exports

    def _worker_exports(self, node: str, rank: int) -> dict[str, str]:
        assert self.placement is not None
        exports: dict[str, str] = {}
        for port in self.graph.node(node).outputs:
            endpoint = f"{node}.{port}"
            kinds = set()
            for edge in self.graph.edges_from(node, port):
                target = edge.target.node
                if target == GRAPH_OUTPUT:
                    continue
                for placed in self.placement.placements_of(target):
                    if placed.ranks[0] != rank:
                        kinds.add(self.transport(endpoint, rank, placed.ranks[0]))
            if kinds:  # one export serves every reader: the most general transport wins
                exports[port] = next(k for k in ("mooncake", "tcp", "shm") if k in kinds)
        return exports

    def kv_transport(self, src: int, dst: int) -> str:
        """How a moved KV travels: the file's default transport, else by host."""
        assert self.placement is not None
        kind = self.placement.file.placement.transport.default
        if kind != "auto":
            return kind
        if self.hosts is not None and self.hosts.host_of(src) != self.hosts.host_of(dst):
            return "tcp"
        return "shm"
