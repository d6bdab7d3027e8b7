"""Streaming edges end to end: an AR decode loop streams its tokens into a stateless node in another
partition, chunked by each policy; the chunk results are checked against the very tokens the same
request produced (they are also emitted on output.token)."""

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request
from mstar.engine.config import EngineConfig
from mstar.graph import (
    FixedChunkPolicy,
    GraphEdge,
    GraphNode,
    LeftContextChunkPolicy,
    Loop,
    ModelGraph,
    PartitionConnection,
    PartitionTopology,
    SlidingWindowChunkPolicy,
    StopOnValues,
    StreamingGraphEdge,
)
from mstar.sampling_params import SamplingParams
from support.toy_graphs import streaming_lm_graph
from support.toy_models import AddOne, ChunkProbe, SumChunk, ToyLM

CONFIG = EngineConfig(num_kv_blocks=64, block_size=4)
PROBE_OUTPUTS = ("total", "new", "n", "ctx", "first")
N = 11  # tokens per request

# (start, end, left_context) of every chunk of an N=11 item stream, worked out by hand
POLICIES = {
    "fixed4": (FixedChunkPolicy(4), [(0, 4, 0), (4, 8, 0), (8, 11, 0)]),  # remainder flushed on close
    "leftctx4_2": (LeftContextChunkPolicy(4, 2), [(0, 4, 0), (2, 8, 2), (6, 11, 2)]),  # remainder flushed on close
    "sliding8_2": (SlidingWindowChunkPolicy(8, 2), [(0, 8, 0), (2, 10, 6)]),  # item 10 never delivered
}


async def events(conductor, request):
    """Every output of one request, in arrival order, as (name, value)."""
    out = []
    async for item in conductor.submit(request):
        out.append((item.name, item.data.item()))
    return out


def by_name(evs, name):
    return [v for n, v in evs if n == name]


def check_chunks(evs, bounds):
    toks = [int(t) for t in by_name(evs, "token")]
    assert len(toks) == N
    assert by_name(evs, "total") == [float(sum(toks[s:e])) for s, e, _ in bounds]
    assert by_name(evs, "new") == [float(sum(toks[s + c : e])) for s, e, c in bounds]
    assert by_name(evs, "n") == [e - s - c for s, e, c in bounds]
    assert by_name(evs, "ctx") == [c for _, _, c in bounds]
    assert by_name(evs, "first") == [float(toks[s]) for s, _, _ in bounds]
    # causality: a chunk's result arrives after every token in it was emitted
    seen = 0
    chunk = 0
    for name, _ in evs:
        if name == "token":
            seen += 1
        elif name == "total":
            assert seen >= bounds[chunk][1], f"chunk {chunk} ({bounds[chunk]}) arrived after only {seen} tokens"
            chunk += 1
    return toks


@pytest.mark.parametrize("key", list(POLICIES))
def test_ar_tokens_stream_through_each_policy(key):
    policy, bounds = POLICIES[key]
    lm = ToyLM()
    g = streaming_lm_graph(policy, consumer="probe", consumer_outputs=PROBE_OUTPUTS)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]

    async def go():
        async with Conductor(g, {"llm": lm, "probe": ChunkProbe()}, config=CONFIG) as c:
            reqs = [Request({"prompt": torch.tensor(p)}, SamplingParams(max_tokens=N)) for p in prompts]
            evs = await asyncio.gather(*(events(c, r) for r in reqs))  # two requests stream at once
            await c.wait_idle()
            return evs

    for prompt, evs in zip(prompts, asyncio.run(go())):
        toks = check_chunks(evs, bounds)
        assert toks == lm.reference_greedy(prompt, N)


def test_sum_chunk_fixed_remainder_after_stop_token():
    """An engine-resident loop stopped by StopOnValues closes the stream: the stop token is not
    streamed, and FixedChunkPolicy flushes the shorter remainder."""
    lm, prompt = ToyLM(), [5, 6, 7, 8, 9, 10, 11]
    ref = lm.reference_greedy(prompt, 20)
    k = next(i for i in range(5, 20) if ref[i] not in ref[:i] and i % 4 != 0)  # first occurrence, not a chunk edge
    stop = ref[k]
    g = streaming_lm_graph(FixedChunkPolicy(4), stop_token=stop)

    async def go():
        async with Conductor(g, {"llm": lm, "sum": SumChunk()}, config=CONFIG) as c:
            evs = await events(c, Request({"prompt": torch.tensor(prompt)}, SamplingParams(max_tokens=20)))
            await c.wait_idle()
            return evs

    evs = asyncio.run(go())
    toks = [int(t) for t in by_name(evs, "token")]
    assert toks == ref[:k] and stop not in toks
    bounds = [(s, min(s + 4, k)) for s in range(0, k, 4)]
    assert by_name(evs, "y") == [float(sum(toks[s:e])) for s, e in bounds]
    assert by_name(evs, "n") == [e - s for s, e in bounds]
    assert by_name(evs, "n")[-1] == k % 4


@pytest.mark.parametrize("key", list(POLICIES))
def test_streaming_edge_to_graph_output(key):
    """A streaming edge straight to a graph output emits each chunk's new items, in order."""
    policy, bounds = POLICIES[key]
    lm, prompt = ToyLM(), [1, 2, 3]
    g = ModelGraph(
        name="stream_out",
        nodes=[GraphNode("llm", inputs=["input_ids"], outputs=["token"], engine="ar")],
        edges=[
            GraphEdge("input.prompt", "llm.input_ids"),
            GraphEdge("llm.token", "llm.input_ids"),
            GraphEdge("llm.token", "output.token"),
            StreamingGraphEdge("llm.token", "output.chunked", target_partition="out"),
        ],
        walks={"main": Loop("llm", max_iters=N)},
        next_walk=lambda s: None if s.last_walk else "main",
        topology=PartitionTopology({"lm": ["llm"], "out": []}, [PartitionConnection("lm", "out", policy)]),
    )

    async def go():
        async with Conductor(g, {"llm": lm}, config=CONFIG) as c:
            evs = await events(c, Request({"prompt": torch.tensor(prompt)}, SamplingParams()))
            await c.wait_idle()
            return evs

    evs = asyncio.run(go())
    toks = [int(t) for t in by_name(evs, "token")]
    assert toks == lm.reference_greedy(prompt, N)
    assert [int(t) for t in by_name(evs, "chunked")] == toks[: bounds[-1][1]]


def test_conductor_loop_streams_and_stop_value_is_not_streamed():
    """A stateless producer in a conductor-driven loop: items 1..9 stream (10 stops the loop)."""
    g = ModelGraph(
        name="count_stream",
        nodes=[
            GraphNode("s", inputs=["x"], outputs=["y"]),
            GraphNode("probe", inputs=["x"], outputs=list(PROBE_OUTPUTS)),
        ],
        edges=[
            GraphEdge("input.x", "s.x"),
            GraphEdge("s.y", "s.x"),
            GraphEdge("s.y", "output.item"),
            StreamingGraphEdge("s.y", "probe.x", target_partition="sink"),
        ]
        + [GraphEdge(f"probe.{p}", f"output.{p}") for p in PROBE_OUTPUTS],
        walks={"main": Loop("s", max_iters=50, stop=StopOnValues("s.y", (10,)))},
        next_walk=lambda s: None if s.last_walk else "main",
        topology=PartitionTopology(
            {"src": ["s"], "sink": ["probe"]}, [PartitionConnection("src", "sink", LeftContextChunkPolicy(4, 1))]
        ),
    )

    async def go():
        async with Conductor(g, {"s": AddOne(), "probe": ChunkProbe()}, config=CONFIG) as c:
            evs = await events(c, Request({"x": torch.tensor(0)}))
            await c.wait_idle()
            return evs

    evs = asyncio.run(go())
    assert by_name(evs, "item") == list(range(1, 10))
    # items 1..9; chunks [1..4], [4|5..8], [8|9]
    assert by_name(evs, "total") == [10.0, 4.0 + 26.0, 8.0 + 9.0]
    assert by_name(evs, "new") == [10.0, 26.0, 9.0]
    assert by_name(evs, "n") == [4, 4, 1]
    assert by_name(evs, "ctx") == [0, 1, 1]
