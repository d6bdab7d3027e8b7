"""A model's Walk Graph: nodes, edges, named Walks, partitions and the per-request state machine.

Everything is checked when the graph is declared, so a wiring mistake fails at
import time with a message that names it, not in the middle of a request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT, RESERVED_NODE_NAMES, GraphEdge, StreamingGraphEdge
from mstar.graph.loop_mode import LoopMode
from mstar.graph.node import GraphNode
from mstar.graph.topology import PartitionTopology
from mstar.graph.validation import GraphError, check_graph
from mstar.graph.walks import Call, Loop, StopOnValues, WalkStep, as_step

if TYPE_CHECKING:
    from mstar.graph.request_state import RequestState

NextWalk = Callable[["RequestState"], "str | None"]


@dataclass
class ModelGraph:
    name: str
    nodes: Sequence[GraphNode]
    edges: Sequence[GraphEdge]
    walks: Mapping[str, WalkStep]
    next_walk: NextWalk
    topology: PartitionTopology | None = None
    # inputs every request must give (None: all of them); a graph whose walks read different
    # inputs lists fewer, and a call that lacks one fails naming its walk, node and port
    required_inputs: Sequence[str] | None = None
    node_by_name: dict[str, GraphNode] = field(init=False)

    def __post_init__(self) -> None:
        self.walks = {name: as_step(step) for name, step in self.walks.items()}
        self.node_by_name = {}
        for node in self.nodes:
            if node.name in RESERVED_NODE_NAMES:
                raise GraphError(
                    f"graph {self.name!r}: node name {node.name!r} is reserved for the graph's inputs/outputs"
                )
            if node.name in self.node_by_name:
                raise GraphError(f"graph {self.name!r}: two nodes are named {node.name!r}")
            self.node_by_name[node.name] = node
        check_graph(self)

    # -- queries the runtime uses -------------------------------------------------
    def node(self, name: str) -> GraphNode:
        try:
            return self.node_by_name[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no node {name!r}") from None

    def walk(self, name: str) -> WalkStep:
        try:
            return self.walks[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no walk {name!r} (walks: {sorted(self.walks)})") from None

    def edges_from(self, node: str, port: str) -> list[GraphEdge]:
        return [e for e in self.edges if e.source.node == node and e.source.port == port]

    def edges_into(self, node: str) -> list[GraphEdge]:
        return [e for e in self.edges if e.target.node == node]

    @property
    def input_names(self) -> list[str]:
        return sorted({e.source.port for e in self.edges if e.source.node == GRAPH_INPUT})

    @property
    def stream_input_names(self) -> list[str]:
        """Inputs that arrive over time (streaming edges from the graph input): a StreamInput each."""
        return sorted(
            {e.source.port for e in self.edges if e.source.node == GRAPH_INPUT and isinstance(e, StreamingGraphEdge)}
        )

    @property
    def output_names(self) -> list[str]:
        return sorted({e.target.port for e in self.edges if e.target.node == GRAPH_OUTPUT})

    def streaming_edges(self) -> list[StreamingGraphEdge]:
        return [e for e in self.edges if isinstance(e, StreamingGraphEdge)]

    def modules(self) -> dict[str, list[str]]:
        """Module name -> the node names (views) that run it."""
        views: dict[str, list[str]] = {}
        for node in self.nodes:
            views.setdefault(node.module_name, []).append(node.name)
        return views

    def engine_resident(self, loop: Loop) -> bool:
        """Whether the engine runs ``loop`` whole: one AR node fed by its own output, or one
        frame node (a rollout: each iteration's predicted frame is the next one's input)."""
        if self.self_feeding(loop) is not None:
            return True
        return (
            isinstance(loop.body, Call) and self.node(loop.body.node).loop_mode is LoopMode.FRAMES and loop.stop is None
        )

    def self_feeding(self, loop: Loop) -> GraphEdge | None:
        """The feedback edge if ``loop`` is one AR node fed by its own output (engine-resident loop)."""
        if not isinstance(loop.body, Call):
            return None
        node = self.node(loop.body.node)
        if node.engine != "ar":
            return None
        if not (loop.stop is None or isinstance(loop.stop, StopOnValues)):
            return None  # a StopWhen reads values the Conductor holds
        for edge in self.edges_into(node.name):
            if edge.source.node == node.name and not isinstance(edge, StreamingGraphEdge):
                return edge
        return None
