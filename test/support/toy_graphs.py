"""Toy Walk Graphs over the toy components."""
from __future__ import annotations

from mstar.graph import (Call, DynamicLoop, GraphEdge, GraphNode, ModelGraph, StopOnValues)


def lm_graph(stop_token: int | None = None) -> ModelGraph:
    """prefill (one call) -> decode (an engine-resident loop) -> done."""

    def next_walk(state):
        return {None: "prefill", "prefill": "decode"}.get(state.last_walk)

    stop = StopOnValues("llm.token", (stop_token,)) if stop_token is not None else None
    return ModelGraph(
        name="toy_lm",
        nodes=[GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar")],
        edges=[GraphEdge("input.prompt", "llm.input_ids"), GraphEdge("llm.token", "llm.input_ids"),
               GraphEdge("llm.token", "output.token")],
        walks={"prefill": Call("llm"),
               "decode": DynamicLoop("llm", trip_count=lambda s: s.request.sampling.max_tokens - 1, stop=stop)},
        next_walk=next_walk,
    )
