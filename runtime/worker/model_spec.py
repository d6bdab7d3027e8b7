"""Builds a model from its ModelSpec: the Conductor (graph only) and each Worker (its nodes)."""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.worker.protocol import ModelSpec


def load_factory(spec: ModelSpec):
    module_name, _, attr = spec.factory.partition(":")
    if not module_name or not attr:
        raise ValueError(f"model factory {spec.factory!r} is not 'module:function'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"model factory {spec.factory!r} cannot be imported: {exc}") from None


def build_model(spec: ModelSpec, nodes: set[str], tp: Any = None) -> tuple[ModelGraph, Mapping[str, NodeSubmodule]]:
    """``(graph, modules)``: modules only for the module(s) behind ``nodes`` (none for the Conductor)."""
    factory = load_factory(spec)
    kwargs = dict(spec.kwargs)
    if tp is not None:
        kwargs["tp"] = tp
    graph, modules = factory(nodes=set(nodes), **kwargs)
    if not isinstance(graph, ModelGraph):
        raise TypeError(f"model factory {spec.factory!r} returned {type(graph).__name__}, not a ModelGraph")
    return graph, modules
