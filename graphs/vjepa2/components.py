"""V-JEPA 2-AC for Worker processes: the graph plus only the submodules a Worker hosts.

Registered as the model ``vjepa2`` (setup.py entry_points["mstar.models"]).
"""

from __future__ import annotations

from pathlib import Path

from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.worker.protocol import ModelSpec
from mstar_graphs.vjepa2.checkpoints import load_encoder, load_predictor, resolve_source
from mstar_graphs.vjepa2.graph import vjepa2_graph
from mstar_graphs.vjepa2.planner import CemEnergy, CemRefit, CemSample

MODEL = "vjepa2"


def vjepa2_spec(weights: str | Path | None = None, *, preset: str = "tiny") -> ModelSpec:
    return ModelSpec(MODEL, {"weights": None if weights is None else str(weights), "preset": preset})


def vjepa2_components(
    nodes: set[str], weights: str | None = None, preset: str = "tiny", progress: bool = False, tp=None
) -> tuple[ModelGraph, dict[str, NodeSubmodule]]:
    if tp is not None:
        raise ValueError("V-JEPA 2-AC does not support tensor parallelism yet (frame Loops run on one rank)")
    source = resolve_source(weights, preset)
    modules: dict[str, NodeSubmodule] = {}
    if "encoder" in nodes:
        modules["encoder"] = load_encoder(source, progress=progress)
    if nodes & {"context", "rollout"}:
        modules["predictor"] = load_predictor(source, progress=progress)
    modules.update({"cem_sample": CemSample(), "cem_energy": CemEnergy(), "cem_refit": CemRefit()})
    return vjepa2_graph(), {k: v for k, v in modules.items() if k in _needed(nodes)}


def _needed(nodes: set[str]) -> set[str]:
    names = {
        "encoder": "encoder",
        "context": "predictor",
        "rollout": "predictor",
        "sample": "cem_sample",
        "energy": "cem_energy",
        "refit": "cem_refit",
    }
    return {names[n] for n in nodes if n in names}
