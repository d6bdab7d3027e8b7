"""Checks a placement against a model graph and answers "which ranks run node N in Walk W"."""

from __future__ import annotations

from dataclasses import dataclass

from mstar.graph.model_graph import ModelGraph
from mstar.placement.schema import NodeGroup, PlacementFile
from mstar.priority import Priority


@dataclass(frozen=True)
class NodePlacement:
    ranks: tuple[int, ...]
    tp_size: int
    group: int  # index of the node group that placed it
    quantization: str | None = None  # the group's override of EngineConfig.quantization


class ResolvedPlacement:
    def __init__(self, graph: ModelGraph, file: PlacementFile) -> None:
        self.graph = graph
        self.file = file
        self.world_size = file.placement.world_size
        # (node, walk) -> placement; walk None holds the groups without a walk list
        self._table: dict[tuple[str, str | None], NodePlacement] = {}
        self.skipped_walks = self._skipped_walks()
        for i, group in enumerate(file.placement.node_groups):
            self._add(i, group)
        self._check_every_used_node_is_placed()
        self._check_transport_edges()
        self._check_kv_views_stay_together()
        self.priorities = self._priorities()  # node or walk name -> class
        self._check_module_quantization()
        # class -> requests in flight at once (checked by the file)
        self.class_limits = {Priority.parse(name): n for name, n in file.placement.class_limits.items()}

    def _add(self, i: int, group: NodeGroup) -> None:
        for j, node in enumerate(group.nodes):
            if node not in self.graph.node_by_name:
                raise self.file.error(
                    ("node_groups", i, "nodes", j),
                    f"unknown node {node!r} (graph {self.graph.name!r} has {sorted(self.graph.node_by_name)})",
                )
        for j, walk in enumerate(group.walks or []):
            if walk not in self.graph.walks:
                raise self.file.error(
                    ("node_groups", i, "walks", j),
                    f"graph {self.graph.name!r} has no walk {walk!r} (walks: {sorted(self.graph.walks)})",
                )
        for node in group.nodes:
            for walk in group.walks or [None]:
                key = (node, walk)
                if key in self._table:
                    scope = f"walk {walk!r}" if walk else "every walk"
                    raise self.file.error(
                        ("node_groups", i, "nodes"),
                        f"node {node!r} is already placed for {scope} by node_groups[{self._table[key].group}]",
                    )
                self._table[key] = NodePlacement(tuple(group.ranks), group.tp_size, i, group.quantization)

    def _priorities(self) -> dict[str, Priority]:
        out = {}
        for name, value in self.file.placement.priorities.items():
            if name not in self.graph.node_by_name and name not in self.graph.walks:
                raise self.file.error(
                    ("priorities", name),
                    f"{name!r} is neither a node nor a walk of graph {self.graph.name!r} "
                    f"(nodes {sorted(self.graph.node_by_name)}, walks {sorted(self.graph.walks)})",
                )
            out[name] = Priority.parse(value)
        return out

    def _skipped_walks(self) -> frozenset[str]:
        for j, walk in enumerate(self.file.placement.skip_walks):
            if walk not in self.graph.walks:
                raise self.file.error(
                    ("skip_walks", j),
                    f"graph {self.graph.name!r} has no walk {walk!r} (walks: {sorted(self.graph.walks)})",
                )
        return frozenset(self.file.placement.skip_walks)

    def _check_every_used_node_is_placed(self) -> None:
        for walk_name, walk in self.graph.walks.items():
            if walk_name in self.skipped_walks:  # not served: its nodes may be placed nowhere
                continue
            for node in dict.fromkeys(walk.node_names()):
                if self.lookup(node, walk_name) is None:
                    raise self.file.error(
                        ("node_groups",), f"node {node!r} is placed nowhere for walk {walk_name!r}, which uses it"
                    )
        for edge in self.graph.streaming_edges():  # streamed chunks run outside any walk
            node = edge.target.node
            if (
                node in self.graph.node_by_name
                and self.lookup(node, None) is None
                and not any(self.lookup(node, w) for w in self.graph.walks)
            ):
                raise self.file.error(
                    ("node_groups",), f"node {node!r} (fed by streaming edge {edge}) is placed nowhere"
                )

    def _check_kv_views_stay_together(self) -> None:
        """A view that forks its KV from another reads that KV in place: same ranks, every Walk."""
        for node in self.graph.nodes:
            for view in node.kv_sources:  # kv_from, then a flow's guidance views
                mine = {p.ranks for p in self.placements_of(node.name)}
                source = {p.ranks for p in self.placements_of(view)}
                if mine and source and mine != source:
                    group = min(p.group for p in self.placements_of(node.name))
                    verb = "forks its KV from" if view == node.kv_from else "reads the KV of guidance view"
                    raise self.file.error(
                        ("node_groups", group, "nodes"),
                        f"node {node.name!r} {verb} {view!r}: place both on the "
                        f"same ranks (got {sorted(mine)} and {sorted(source)})",
                    )

    def _check_module_quantization(self) -> None:
        """The views of one module share its weights: the groups that set a quantization for them set
        one alike. A group that sets none follows the engine config, unknown here, so it is not compared
        (an explicit ``none`` is a value like ``int8``; the engine refuses a module asked two ways)."""
        for module, views in self.graph.modules().items():
            seen: dict[str, int] = {}
            for view in views:
                for p in self.placements_of(view):
                    if p.quantization is not None:
                        seen.setdefault(p.quantization, p.group)
            if len(seen) > 1:
                raise self.file.error(
                    ("node_groups", max(seen.values()), "quantization"),
                    f"module {module!r} (nodes {views}) shares its weights between node groups: "
                    f"give them one quantization (got {sorted(seen)})",
                )

    def quantization_on(self, rank: int) -> dict[str, str]:
        """node -> the quantization its node group sets, for the nodes ``rank`` hosts (groups that set none left out)."""
        return {n: p.quantization for (n, _), p in self._table.items() if rank in p.ranks and p.quantization}

    def _check_transport_edges(self) -> None:
        for endpoint in self.file.placement.transport.edges:
            node, _, port = endpoint.partition(".")
            gnode = self.graph.node_by_name.get(node)
            if gnode is None or port not in gnode.outputs:
                raise self.file.error(
                    ("transport", "edges", endpoint),
                    f"{endpoint!r} is not an output of a node of graph {self.graph.name!r}",
                )

    def transport_for(self, endpoint: str) -> str:
        """The transport the file asks for values of ``endpoint`` ("auto" when it does not say)."""
        choice = self.file.placement.transport
        return choice.edges.get(endpoint, choice.default)

    def check_served(self, walk: str | None) -> None:
        """ValueError when the placement does not serve ``walk`` (its ``skip_walks``)."""
        if walk in self.skipped_walks:
            raise ValueError(f"walk {walk!r} is not served by placement {self.file.source} (its skip_walks)")

    def lookup(self, node: str, walk: str | None) -> NodePlacement | None:
        """Where ``node`` runs during ``walk`` (a walk-scoped group wins over an unscoped one)."""
        return self._table.get((node, walk)) or self._table.get((node, None))

    def items(self) -> list[tuple[tuple[str, str | None], NodePlacement]]:
        """((node, walk or None), placement) for every placed pair."""
        return list(self._table.items())

    def placements_of(self, node: str) -> list[NodePlacement]:
        """Every placement of ``node`` (over all Walks): where its KV or outputs may be needed."""
        return [p for (n, _), p in self._table.items() if n == node]

    def ranks_used(self) -> list[int]:
        return sorted({r for p in self._table.values() for r in p.ranks})

    def device_of(self, rank: int) -> str:
        return self.file.placement.device_of(rank)


def load_placement(path: str, graph: ModelGraph) -> ResolvedPlacement:
    return ResolvedPlacement(graph, PlacementFile.load(path))
