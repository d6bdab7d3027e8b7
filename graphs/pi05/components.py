"""pi0.5 for Worker processes: the graph plus only the submodules a Worker hosts.

Registered as the model ``pi05`` (setup.py entry_points["mstar.models"]), so
``ModelSpec("pi05", {...})`` names it: each Worker calls
it with the nodes the placement gives it (the Conductor with none), so a rank that
runs only the vision tower never loads the LLM and back.
"""

from __future__ import annotations

from pathlib import Path

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.worker.protocol import ModelSpec
from mstar_graphs.pi05.checkpoints import resolve_path
from mstar_graphs.pi05.config import Pi05Config
from mstar_graphs.pi05.graph import pi05_graph

MODEL = "pi05"  # its registered name


def pi05_spec(weights: str | Path | None = None, *, preset: str = "tiny") -> ModelSpec:
    return ModelSpec(MODEL, {"weights": None if weights is None else str(weights), "preset": preset})


def pi05_components(
    nodes: set[str], weights: str | None = None, preset: str = "tiny", progress: bool = False, tp=None
) -> tuple[ModelGraph, dict[str, NodeSubmodule]]:
    if tp is not None:
        raise ValueError("pi0.5 does not support tensor parallelism yet (flow Loops run on one rank)")
    path = resolve_path(weights, preset)
    graph = pi05_graph(Pi05Config.from_dir(path).num_steps)
    modules: dict[str, NodeSubmodule] = {}
    if nodes & {"prefix", "action"}:
        from mstar_graphs.pi05.pi05 import Pi05Model

        modules["pi05"] = Pi05Model.from_pretrained_dir(path, progress=progress)
    if "vision" in nodes:
        from mstar_graphs.pi05.siglip import Pi05ImageEncoder

        modules["vision"] = Pi05ImageEncoder.from_pretrained_dir(path, progress=progress)
    return graph, modules
