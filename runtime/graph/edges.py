"""Edges between node ports: ``"node.port"`` endpoints, plus the graph's own inputs and outputs.

``"input.<name>"`` is a value the request brings; ``"output.<name>"`` is a value
streamed back to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

GRAPH_INPUT = "input"
GRAPH_OUTPUT = "output"
RESERVED_NODE_NAMES = frozenset({GRAPH_INPUT, GRAPH_OUTPUT})


@dataclass(frozen=True)
class Endpoint:
    node: str
    port: str

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        node, dot, port = text.partition(".")
        if not dot or not node or not port:
            raise ValueError(f"edge endpoint {text!r} is not of the form 'node.port'")
        return cls(node, port)

    def __str__(self) -> str:
        return f"{self.node}.{self.port}"


@dataclass(frozen=True)
class GraphEdge:
    """Carries each value produced at ``src`` to ``dst`` (the latest value wins)."""

    src: str
    dst: str

    @property
    def source(self) -> Endpoint:
        return Endpoint.parse(self.src)

    @property
    def target(self) -> Endpoint:
        return Endpoint.parse(self.dst)

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}"


@dataclass(frozen=True)
class StreamingGraphEdge(GraphEdge):
    """Accumulates values produced at ``src`` as a stream; the chunk policy of the
    connection into ``target_partition`` decides when a chunk of them runs ``dst``."""

    target_partition: str = ""

    def __str__(self) -> str:
        return f"{self.src} ~> {self.dst} [{self.target_partition}]"
