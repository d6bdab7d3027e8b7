"""Declaration-time checks of a ModelGraph; each error names what is wrong."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mstar.graph.edges import GRAPH_INPUT, GRAPH_OUTPUT, Endpoint, StreamingGraphEdge
from mstar.graph.walks import AwaitInput, Call, Loop, StopOnValues

if TYPE_CHECKING:
    from mstar.graph.model_graph import ModelGraph


class GraphError(ValueError):
    """A model graph that cannot run as declared."""


def check_graph(graph: ModelGraph) -> None:
    _check_edges(graph)
    _check_inputs_fed(graph)
    _check_walks(graph)
    _check_topology(graph)
    _check_cycles(graph)
    _check_views(graph)
    _check_fed_inputs(graph)


def _check_edges(graph: ModelGraph) -> None:
    for edge in graph.edges:
        try:
            src, dst = edge.source, edge.target
        except ValueError as exc:
            raise GraphError(f"graph {graph.name!r}: edge {edge}: {exc}") from None
        if src.node == GRAPH_OUTPUT:
            raise GraphError(f"graph {graph.name!r}: edge {edge} starts at the graph output")
        if dst.node == GRAPH_INPUT:
            raise GraphError(f"graph {graph.name!r}: edge {edge} ends at the graph input")
        if src.node != GRAPH_INPUT:
            node = graph.node_by_name.get(src.node)
            if node is None:
                raise GraphError(f"graph {graph.name!r}: edge {edge} starts at unknown node {src.node!r}")
            if src.port not in node.outputs:
                raise GraphError(
                    f"graph {graph.name!r}: edge {edge}: node {src.node!r} has no output {src.port!r} (outputs: {list(node.outputs)})"
                )
        if dst.node != GRAPH_OUTPUT:
            node = graph.node_by_name.get(dst.node)
            if node is None:
                raise GraphError(f"graph {graph.name!r}: edge {edge} ends at unknown node {dst.node!r}")
            if dst.port not in node.inputs:
                raise GraphError(
                    f"graph {graph.name!r}: edge {edge}: node {dst.node!r} has no input {dst.port!r} (inputs: {list(node.inputs)})"
                )


def _check_inputs_fed(graph: ModelGraph) -> None:
    fed = {(e.target.node, e.target.port) for e in graph.edges}
    for node in graph.nodes:
        for port in node.inputs:
            if (node.name, port) not in fed:
                raise GraphError(f"graph {graph.name!r}: input {node.name}.{port} is dangling: no edge feeds it")


def _check_walks(graph: ModelGraph) -> None:
    stream_fed = any(isinstance(e, StreamingGraphEdge) and e.source.node == GRAPH_INPUT for e in graph.edges)
    if not graph.walks and not stream_fed:  # a partition cut out of a graph may run on its input streams alone
        raise GraphError(f"graph {graph.name!r} declares no walks")
    for walk_name, walk in graph.walks.items():
        for step in walk.iter_steps():
            if isinstance(step, Call) and step.node not in graph.node_by_name:
                raise GraphError(f"graph {graph.name!r}: walk {walk_name!r} calls unknown node {step.node!r}")
            if isinstance(step, AwaitInput) and step.name not in graph.stream_input_names:
                raise GraphError(
                    f"graph {graph.name!r}: walk {walk_name!r} awaits {step.name!r}, which is no streamed "
                    f"input (streamed inputs: {graph.stream_input_names})"
                )
            if isinstance(step, Loop) and isinstance(step.stop, StopOnValues):
                try:
                    src = Endpoint.parse(step.stop.edge)
                except ValueError as exc:
                    raise GraphError(f"graph {graph.name!r}: walk {walk_name!r}: stop edge: {exc}") from None
                node = graph.node_by_name.get(src.node)
                if node is None or src.port not in node.outputs:
                    raise GraphError(
                        f"graph {graph.name!r}: walk {walk_name!r}: loop stops on {step.stop.edge!r}, which is no node output"
                    )


def _check_topology(graph: ModelGraph) -> None:
    topo = graph.topology
    streaming = [e for e in graph.edges if isinstance(e, StreamingGraphEdge)]
    if topo is None:
        if streaming:
            raise GraphError(f"graph {graph.name!r}: streaming edge {streaming[0]} needs a PartitionTopology")
        return
    seen: dict[str, str] = {}
    for part, nodes in topo.partitions.items():
        for node in nodes:
            if node not in graph.node_by_name:
                raise GraphError(f"graph {graph.name!r}: partition {part!r} lists unknown node {node!r}")
            if node in seen:
                raise GraphError(f"graph {graph.name!r}: node {node!r} is in partitions {seen[node]!r} and {part!r}")
            seen[node] = part
    for conn in topo.connections:
        for part in (conn.source, conn.target):
            if part not in topo.partitions and not (part == GRAPH_INPUT and part == conn.source):
                raise GraphError(
                    f"graph {graph.name!r}: connection {conn.source!r} -> {conn.target!r} names missing partition {part!r}"
                )
    for edge in streaming:
        target = edge.target_partition
        if target not in topo.partitions:
            raise GraphError(
                f"graph {graph.name!r}: streaming edge {edge} targets missing partition {target!r} (partitions: {sorted(topo.partitions)})"
            )
        if edge.target.node != GRAPH_OUTPUT and edge.target.node not in topo.partitions[target]:
            raise GraphError(
                f"graph {graph.name!r}: streaming edge {edge} ends at {edge.target.node!r}, which is not in partition {target!r}"
            )
        source = topo.partition_of(edge.source.node)
        if source is None:
            raise GraphError(
                f"graph {graph.name!r}: streaming edge {edge} starts at {edge.source.node!r}, which is in no partition"
            )
        if topo.policy(source, target) is None:
            raise GraphError(
                f"graph {graph.name!r}: streaming edge {edge} has no chunk policy: add PartitionConnection({source!r}, {target!r}, policy)"
            )


def _check_cycles(graph: ModelGraph) -> None:
    """Every cycle of (non-streaming) node-to-node edges must lie inside one Loop body."""
    succ: dict[str, set[str]] = {n: set() for n in graph.node_by_name}
    for e in graph.edges:
        if isinstance(e, StreamingGraphEdge):
            continue
        if e.source.node in succ and e.target.node in succ:
            succ[e.source.node].add(e.target.node)
    loop_bodies = [
        set(step.body.node_names())
        for walk in graph.walks.values()
        for step in walk.iter_steps()
        if isinstance(step, Loop)
    ]
    for component in _strongly_connected(succ):
        cyclic = len(component) > 1 or any(n in succ[n] for n in component)
        if cyclic and not any(component <= body for body in loop_bodies):
            path = " -> ".join(sorted(component) + [sorted(component)[0]])
            raise GraphError(f"graph {graph.name!r}: cycle {path} is not inside any Loop")


def _strongly_connected(succ: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm (graphs are tiny; recursion depth is the node count)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in succ:
        if v not in index:
            visit(v)
    return out


def _check_views(graph: ModelGraph) -> None:
    for node in graph.nodes:
        for source in node.kv_sources:  # kv_from, then guidance views
            what = "forks KV from" if source == node.kv_from else "takes guidance from"
            src = graph.node_by_name.get(source)
            if src is None:
                raise GraphError(f"graph {graph.name!r}: node {node.name!r} {what} unknown node {source!r}")
            if node.engine != "ar" or src.engine != "ar" or src.module_name != node.module_name:
                verb = "fork KV" if source == node.kv_from else "take guidance"
                raise GraphError(
                    f"graph {graph.name!r}: node {node.name!r} can {verb} only from an AR view of the same module, not {source!r}"
                )
    for module, names in graph.modules().items():
        kinds = {graph.node_by_name[n].engine for n in names}
        if len(kinds) > 1:
            raise GraphError(
                f"graph {graph.name!r}: module {module!r} is viewed by nodes {names} with different engine kinds {sorted(kinds)}"
            )


def _check_fed_inputs(graph: ModelGraph) -> None:
    """A fed input is reached by exactly one streaming edge, from a node's ``step_*`` output."""
    for node in graph.nodes:
        for port in node.fed_inputs:
            into = [e for e in graph.edges_into(node.name) if e.target.port == port]
            if (
                len(into) != 1
                or not isinstance(into[0], StreamingGraphEdge)
                or not into[0].source.port.startswith("step_")
            ):
                raise GraphError(
                    f"graph {graph.name!r}: fed input {node.name}.{port} needs exactly one streaming edge "
                    f"into it, from a node's 'step_<rows>' output (has: {[str(e) for e in into]})"
                )
