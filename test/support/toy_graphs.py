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


def streaming_lm_graph(policy, consumer: str = "sum", consumer_outputs=("y", "n"), stop_token: int | None = None,
                       name: str = "toy_streaming_lm") -> ModelGraph:
    """lm_graph whose tokens also stream into a stateless ``consumer`` node (input ``x``) in
    another partition, chunked by ``policy``; ``llm.token`` -> ``output.token`` and each consumer
    output ``p`` -> ``output.<p>``. Modules: ``"llm"`` (ToyLM) and ``consumer`` (e.g. SumChunk)."""
    from mstar.graph import PartitionConnection, PartitionTopology, StreamingGraphEdge

    def next_walk(state):
        return {None: "prefill", "prefill": "decode"}.get(state.last_walk)

    stop = StopOnValues("llm.token", (stop_token,)) if stop_token is not None else None
    edges = [GraphEdge("input.prompt", "llm.input_ids"), GraphEdge("llm.token", "llm.input_ids"),
             GraphEdge("llm.token", "output.token"),
             StreamingGraphEdge("llm.token", f"{consumer}.x", target_partition="sink")]
    edges += [GraphEdge(f"{consumer}.{p}", f"output.{p}") for p in consumer_outputs]
    return ModelGraph(
        name=name,
        nodes=[GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar"),
               GraphNode(consumer, inputs=["x"], outputs=list(consumer_outputs))],
        edges=edges,
        walks={"prefill": Call("llm"),
               "decode": DynamicLoop("llm", trip_count=lambda s: s.request.sampling.max_tokens - 1, stop=stop)},
        next_walk=next_walk,
        topology=PartitionTopology(partitions={"lm": ["llm"], "sink": [consumer]},
                                   connections=[PartitionConnection("lm", "sink", policy)]),
    )
