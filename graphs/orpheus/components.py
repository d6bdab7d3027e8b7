"""Orpheus for Worker processes: the graph plus only the submodules a Worker hosts.

Registered as the model ``orpheus`` (entry point group ``mstar.models`` in setup.py), so
``ModelSpec("orpheus", {...})`` names it; each Worker process calls it with the nodes the placement gives it (the Conductor
with none, for the graph alone), so the SNAC rank never loads the LLM and back.
"""

from __future__ import annotations

from pathlib import Path

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.worker.protocol import ModelSpec
from mstar_graphs.orpheus.checkpoints import resolve_paths
from mstar_graphs.orpheus.graph import orpheus_graph

MODEL = "orpheus"  # its registered name (setup.py entry_points["mstar.models"])


def orpheus_spec(
    weights: str | Path | None = None,
    snac_weights: str | Path | None = None,
    *,
    preset: str = "tiny",
    constrain: bool = True,
) -> ModelSpec:
    kwargs = {
        "weights": None if weights is None else str(weights),
        "snac_weights": None if snac_weights is None else str(snac_weights),
        "preset": preset,
        "constrain": constrain,
    }
    return ModelSpec(MODEL, kwargs)


def orpheus_components(
    nodes: set[str],
    weights: str | None = None,
    snac_weights: str | None = None,
    preset: str = "tiny",
    constrain: bool = True,
    progress: bool = False,
    tp=None,
) -> tuple[ModelGraph, dict[str, NodeSubmodule]]:
    from mstar_graphs.orpheus.frontend import OrpheusLLM  # the Conductor (no nodes) never imports the model code
    from mstar_graphs.orpheus.snac_stage import OrpheusSnacStage

    graph = orpheus_graph()
    modules: dict[str, NodeSubmodule] = {}
    if not nodes:
        return graph, modules
    paths = resolve_paths(weights, snac_weights, preset)
    if "llm" in nodes:
        kwargs = {} if tp is None else {"tp": tp}
        llm = OrpheusLLM.from_pretrained_dir(paths.llm, progress=progress, **kwargs)
        llm.fuse_projections()
        llm.constrain = constrain
        modules["llm"] = llm
    if "snac" in nodes:
        modules["snac"] = OrpheusSnacStage.from_pretrained_dir(paths.snac, progress=progress)
    return graph, modules
