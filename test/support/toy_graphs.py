"""Toy Walk Graphs over the toy components."""

from __future__ import annotations

from mstar.graph import Call, DynamicLoop, GraphEdge, GraphNode, ModelGraph, StopOnValues


def lm_graph(stop_token: int | None = None) -> ModelGraph:
    """prefill (one call) -> decode (an engine-resident loop) -> done."""

    def next_walk(state):
        return {None: "prefill", "prefill": "decode"}.get(state.last_walk)

    stop = StopOnValues("llm.token", (stop_token,)) if stop_token is not None else None
    return ModelGraph(
        name="toy_lm",
        nodes=[GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar")],
        edges=[
            GraphEdge("input.prompt", "llm.input_ids"),
            GraphEdge("llm.token", "llm.input_ids"),
            GraphEdge("llm.token", "output.token"),
        ],
        walks={
            "prefill": Call("llm"),
            "decode": DynamicLoop("llm", trip_count=lambda s: s.request.sampling.max_tokens - 1, stop=stop),
        },
        next_walk=next_walk,
    )


def streaming_lm_graph(
    policy,
    consumer: str = "sum",
    consumer_outputs=("y", "n"),
    stop_token: int | None = None,
    name: str = "toy_streaming_lm",
) -> ModelGraph:
    """lm_graph whose tokens also stream into a stateless ``consumer`` node (input ``x``) in
    another partition, chunked by ``policy``; ``llm.token`` -> ``output.token`` and each consumer
    output ``p`` -> ``output.<p>``. Modules: ``"llm"`` (ToyLM) and ``consumer`` (e.g. SumChunk)."""
    from mstar.graph import PartitionConnection, PartitionTopology, StreamingGraphEdge

    def next_walk(state):
        return {None: "prefill", "prefill": "decode"}.get(state.last_walk)

    stop = StopOnValues("llm.token", (stop_token,)) if stop_token is not None else None
    edges = [
        GraphEdge("input.prompt", "llm.input_ids"),
        GraphEdge("llm.token", "llm.input_ids"),
        GraphEdge("llm.token", "output.token"),
        StreamingGraphEdge("llm.token", f"{consumer}.x", target_partition="sink"),
    ]
    edges += [GraphEdge(f"{consumer}.{p}", f"output.{p}") for p in consumer_outputs]
    return ModelGraph(
        name=name,
        nodes=[
            GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar"),
            GraphNode(consumer, inputs=["x"], outputs=list(consumer_outputs)),
        ],
        edges=edges,
        walks={
            "prefill": Call("llm"),
            "decode": DynamicLoop("llm", trip_count=lambda s: s.request.sampling.max_tokens - 1, stop=stop),
        },
        next_walk=next_walk,
        topology=PartitionTopology(
            partitions={"lm": ["llm"], "sink": [consumer]}, connections=[PartitionConnection("lm", "sink", policy)]
        ),
    )


def fed_loop_graph() -> ModelGraph:
    """A ``producer`` LM (RowsLM) whose decode Loop streams its rows into the running Loop of a
    ``consumer`` LM (FedLM, fed input ``text``). Walks: ``prefill`` (the producer's prompt), then
    ``together`` (both Loops at once: the consumer reads rows as they are made) or, with request meta
    ``after``, ``after`` (the consumer starts once the producer is done: every row is there)."""
    from mstar.graph import (
        FixedChunkPolicy,
        Parallel,
        PartitionConnection,
        PartitionTopology,
        Sequential,
        StreamingGraphEdge,
    )

    def next_walk(state):
        if state.last_walk is None:
            return "prefill"
        if state.last_walk == "prefill":
            return "after" if state.request.meta.get("after") else "together"
        return None

    produce = DynamicLoop(
        "producer", trip_count=lambda s: s.request.meta.get("produce", 8) - 1, stop=StopOnValues("producer.token", (0,))
    )
    consume = DynamicLoop("consumer", trip_count=lambda s: s.request.meta.get("consume", 12))
    return ModelGraph(
        name="toy_fed_loop",
        nodes=[
            GraphNode("producer", inputs=["input_ids"], outputs=["token", "rows", "step_rows"], engine="ar"),
            GraphNode(
                "consumer",
                inputs=["input_ids", "text"],
                outputs=["token"],
                engine="ar",
                fed_inputs=["text"],
                optional_inputs=["text"],
            ),
        ],
        edges=[
            GraphEdge("input.prompt", "producer.input_ids"),
            GraphEdge("producer.token", "producer.input_ids"),
            GraphEdge("producer.token", "output.text"),
            GraphEdge("input.prompt2", "consumer.input_ids"),
            GraphEdge("consumer.token", "consumer.input_ids"),
            GraphEdge("consumer.token", "output.spoken"),
            StreamingGraphEdge("producer.step_rows", "consumer.text", target_partition="b"),
        ],
        walks={
            "prefill": Call("producer"),
            "together": Parallel(produce, consume),
            "after": Sequential(produce, consume),
        },
        topology=PartitionTopology(
            partitions={"a": ["producer"], "b": ["consumer"]},
            connections=[PartitionConnection("a", "b", FixedChunkPolicy(1))],
        ),
        next_walk=next_walk,
    )
