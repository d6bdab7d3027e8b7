"""Partitions of a graph and the chunk policy of each streaming connection between them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mstar.graph.chunk_policies import ChunkPolicy
from mstar.graph.edges import GRAPH_INPUT


@dataclass(frozen=True)
class PartitionConnection:
    source: str
    target: str
    policy: ChunkPolicy


@dataclass
class PartitionTopology:
    """``partitions``: name -> node names. ``connections``: chunk policy per (source, target) pair."""

    partitions: Mapping[str, Sequence[str]]
    connections: Sequence[PartitionConnection] = field(default_factory=tuple)

    def partition_of(self, node: str) -> str | None:
        """The partition holding ``node``; ``"input"`` for the graph input (streams fed from outside)."""
        if node == GRAPH_INPUT:
            return GRAPH_INPUT
        for name, nodes in self.partitions.items():
            if node in nodes:
                return name
        return None

    def policy(self, source: str, target: str) -> ChunkPolicy | None:
        for conn in self.connections:
            if conn.source == source and conn.target == target:
                return conn.policy
        return None
