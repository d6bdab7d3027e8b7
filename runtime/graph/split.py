"""Cut a graph at a partition: the partition alone, as a graph of its own.

This is how two partitions run as separate services (e.g. separate ROS nodes joined
by a topic): every edge that crosses the cut becomes a graph input or output of the
partition's graph, under one name on both sides (:func:`crossing_name`):

- a streaming edge leaving the partition -> ``output.<name>``: each item streamed out
  as it is produced (the consumer side applies the chunk policy);
- a streaming edge entering it -> ``StreamingGraphEdge("input.<name>", dst)`` with the
  cut connection's chunk policy, fed by a ``StreamInput`` at request time;
- a value edge leaving / entering -> ``output.<name>`` / ``input.<name>``.

Walks that call only the partition's nodes are kept with the model's ``next_walk``;
a partition driven only by its streams (a vocoder) has no walks: its requests run
the chunks of their streams until they close.
"""

from __future__ import annotations

from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT, GraphEdge, StreamingGraphEdge
from mstar.graph.model_graph import ModelGraph
from mstar.graph.topology import PartitionConnection, PartitionTopology
from mstar.graph.validation import GraphError


def crossing_name(edge: GraphEdge) -> str:
    """The name an edge cut between partitions has on both sides: its source, ``node_port``."""
    return f"{edge.source.node}_{edge.source.port}"


def _no_walks(state) -> None:
    return None


def split_partition(graph: ModelGraph, partition: str) -> ModelGraph:
    topo = graph.topology
    if topo is None or partition not in topo.partitions:
        known = sorted(topo.partitions) if topo else []
        raise GraphError(f"graph {graph.name!r} has no partition {partition!r} (partitions: {known})")
    inside = set(topo.partitions[partition])
    for name in inside:
        for source in graph.node(name).kv_sources:
            if source in inside:
                continue
            raise GraphError(
                f"graph {graph.name!r}: node {name!r} in partition {partition!r} reads the KV of "
                f"{source!r}, which is in another partition: they cannot run apart"
            )

    def side(node: str) -> str:
        return "in" if node in inside else ("io" if node in (GRAPH_INPUT, GRAPH_OUTPUT) else "out")

    edges: list[GraphEdge] = []
    connections: list[PartitionConnection] = []
    crossing: dict[str, str] = {}  # name -> the source endpoint it stands for
    for edge in graph.edges:
        src, dst = side(edge.source.node), side(edge.target.node)
        if src != "in" and dst != "in":
            continue  # entirely elsewhere
        name = crossing_name(edge)
        if src != dst and "io" not in (src, dst) and crossing.setdefault(name, edge.src) != edge.src:
            raise GraphError(
                f"graph {graph.name!r}: cut edges from {crossing[name]} and {edge.src} would both be "
                f"named {name!r}; rename a port"
            )
        if src == "in" and dst == "out":
            edges.append(GraphEdge(edge.src, f"{GRAPH_OUTPUT}.{name}"))
        elif src == "out" and dst == "in":
            if isinstance(edge, StreamingGraphEdge):
                upstream = topo.partition_of(edge.source.node)
                policy = topo.policy(upstream, edge.target_partition)  # type: ignore[arg-type]
                edges.append(StreamingGraphEdge(f"{GRAPH_INPUT}.{name}", edge.dst, target_partition=partition))
                if connections and connections[0].policy != policy:
                    raise GraphError(
                        f"graph {graph.name!r}: partition {partition!r} takes streams under two "
                        "different chunk policies; it cannot be cut out on its own"
                    )
                if not connections:
                    connections.append(PartitionConnection(GRAPH_INPUT, partition, policy))  # type: ignore[arg-type]
            else:
                edges.append(GraphEdge(f"{GRAPH_INPUT}.{name}", edge.dst))
        else:
            edges.append(edge)
    edges = list(dict.fromkeys(edges))  # one output per crossing source, however many readers it had
    own = {e.source.port for e in graph.edges if e.source.node == GRAPH_INPUT} | {
        e.target.port for e in graph.edges if e.target.node == GRAPH_OUTPUT
    }
    for name, source in crossing.items():
        if name in own:
            raise GraphError(
                f"graph {graph.name!r}: the cut edge from {source} would be named {name!r}, which is "
                "already one of the graph's own inputs or outputs; rename a port"
            )
    walks = {}
    for name, step in graph.walks.items():
        called = set(step.node_names())
        if called & inside and called - inside:
            raise GraphError(
                f"graph {graph.name!r}: walk {name!r} calls nodes inside partition {partition!r} "
                f"({sorted(called & inside)}) and outside it ({sorted(called - inside)}): a partition "
                "run on its own needs walks of its own nodes only"
            )
        if called <= inside:
            walks[name] = step
    # its own streams, and those of the graph's input into it (one policy for everything it takes as input streams)
    own_inputs = [c for c in topo.connections if c.source == GRAPH_INPUT and c.target == partition]
    if own_inputs and connections and own_inputs[0].policy != connections[0].policy:
        raise GraphError(
            f"graph {graph.name!r}: partition {partition!r} takes streams under two different chunk "
            "policies; it cannot be cut out on its own"
        )
    connections = (connections or own_inputs) + [c for c in topo.connections if c.source == c.target == partition]
    return ModelGraph(
        name=f"{graph.name}.{partition}",
        nodes=[n for n in graph.nodes if n.name in inside],
        edges=edges,
        walks=walks,
        next_walk=graph.next_walk if walks else _no_walks,
        topology=PartitionTopology({partition: sorted(inside)}, connections),
    )
