"""Builds a model from its ModelSpec: the Conductor (graph only) and each Worker (its nodes).

The spec names a registered model (``mstar.worker.registry``); nothing a peer sends is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.worker import registry
from mstar.worker.protocol import ModelSpec


def load_factory(spec: ModelSpec) -> Callable[..., tuple[ModelGraph, Mapping[str, NodeSubmodule]]]:
    return registry.resolve(registry.MODELS, spec.model)


def build_model(spec: ModelSpec, nodes: set[str], tp: Any = None) -> tuple[ModelGraph, Mapping[str, NodeSubmodule]]:
    """``(graph, modules)``: modules only for the module(s) behind ``nodes`` (none for the Conductor)."""
    factory = load_factory(spec)
    kwargs = dict(spec.kwargs)
    if tp is not None:
        kwargs["tp"] = tp
    graph, modules = factory(nodes=set(nodes), **kwargs)
    if not isinstance(graph, ModelGraph):
        raise TypeError(f"model {spec.model!r} returned {type(graph).__name__}, not a ModelGraph")
    return graph, modules
