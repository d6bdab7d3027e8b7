"""Cutting a graph at a partition: each side runs in its own Conductor, joined only by the items of
the cut streaming edge (a StreamInput), and together they give exactly what the whole graph gives."""

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request, RequestError
from mstar.conductor.stream_input import StreamInput
from mstar.engine.config import EngineConfig
from mstar.graph import GraphError, LeftContextChunkPolicy, SlidingWindowChunkPolicy
from mstar.graph.split import crossing_name, split_partition
from mstar.sampling_params import SamplingParams
from support.toy_graphs import streaming_lm_graph
from support.toy_models import ChunkProbe, ToyLM

CONFIG = EngineConfig(num_kv_blocks=64, block_size=4)
OUTS = ("total", "new", "n", "ctx", "first")
N = 11


def test_split_turns_crossing_edges_into_inputs_and_outputs():
    g = streaming_lm_graph(LeftContextChunkPolicy(4, 2), consumer="probe", consumer_outputs=OUTS)
    lm, sink = split_partition(g, "lm"), split_partition(g, "sink")
    assert lm.output_names == ["llm_token", "token"] and lm.input_names == ["prompt"]
    assert set(lm.walks) == {"prefill", "decode"} and lm.streaming_edges() == []
    assert sink.input_names == sink.stream_input_names == ["llm_token"]
    assert sink.output_names == sorted(OUTS) and sink.walks == {}
    (edge,) = sink.streaming_edges()
    assert (edge.src, edge.dst) == ("input.llm_token", "probe.x")
    assert sink.topology.policy("input", "sink") == LeftContextChunkPolicy(4, 2)
    assert crossing_name(g.streaming_edges()[0]) == "llm_token"


def test_unknown_partition_is_named():
    g = streaming_lm_graph(LeftContextChunkPolicy(4, 2), consumer="probe", consumer_outputs=OUTS)
    with pytest.raises(GraphError, match="no partition 'vocoder'.*'lm', 'sink'"):
        split_partition(g, "vocoder")


async def _whole(g, modules, prompt, seed):
    async with Conductor(g, modules, config=CONFIG) as c:
        return await c.submit(
            Request({"prompt": torch.tensor(prompt)}, SamplingParams(max_tokens=N, seed=seed))
        ).collect()


async def _split(g, modules, prompt, seed):
    """Producer and consumer in separate Conductors; items cross one at a time, as a topic would carry them."""
    lm_graph, sink_graph = split_partition(g, "lm"), split_partition(g, "sink")
    async with (
        Conductor(lm_graph, {"llm": modules["llm"]}, config=CONFIG) as producer,
        Conductor(sink_graph, {"probe": modules["probe"]}) as consumer,
    ):
        feed = StreamInput()
        sink_out = consumer.submit(Request({"llm_token": feed}, SamplingParams(seed=seed)))
        collected = asyncio.ensure_future(sink_out.collect())
        tokens = []
        async for out in producer.submit(
            Request({"prompt": torch.tensor(prompt)}, SamplingParams(max_tokens=N, seed=seed))
        ):
            if out.name == "llm_token":
                feed.put(out.data)
            else:
                tokens.append(out.data)
        feed.close()
        return tokens, await collected


@pytest.mark.parametrize("policy", [LeftContextChunkPolicy(4, 2), SlidingWindowChunkPolicy(8, 2)])
def test_two_conductors_joined_by_a_stream_equal_the_whole_graph(policy):
    g = streaming_lm_graph(policy, consumer="probe", consumer_outputs=OUTS)
    modules = {"llm": ToyLM(), "probe": ChunkProbe()}
    whole = asyncio.run(_whole(g, modules, [3, 1, 4, 1, 5], seed=3))
    tokens, parts = asyncio.run(_split(g, modules, [3, 1, 4, 1, 5], seed=3))
    assert [int(t) for t in tokens] == [int(t) for t in whole["token"]]
    for name in OUTS:
        assert [float(v) for v in parts[name]] == [float(v) for v in whole[name]], name
    assert len(parts["total"]) >= 2


def test_a_tensor_for_a_streamed_input_is_refused_and_a_failed_stream_fails_its_request():
    g = streaming_lm_graph(LeftContextChunkPolicy(4, 2), consumer="probe", consumer_outputs=OUTS)
    sink = split_partition(g, "sink")

    async def go():
        async with Conductor(sink, {"probe": ChunkProbe()}) as c:
            with pytest.raises(TypeError, match="input 'llm_token' must be a StreamInput"):
                c.submit(Request({"llm_token": torch.tensor([1])}))
            bad, good = StreamInput(), StreamInput()
            failing = c.submit(Request({"llm_token": bad}, request_id="bad"))
            serving = c.submit(Request({"llm_token": good}, request_id="good"))
            for i in range(5):
                bad.put(torch.tensor(i))
                good.put(torch.tensor(i))
            bad.fail("item 6 never arrived (sequence gap)")
            good.close()
            with pytest.raises(RequestError, match="request bad: input stream failed: item 6 never arrived"):
                await failing.collect()
            ok = await serving.collect()
            await c.wait_idle(timeout=5)
            return ok

    ok = asyncio.run(go())
    assert [float(v) for v in ok["total"]] == [6.0, 9.0]  # (0..3), (2..4) with 2 items of left context


def test_a_view_reading_kv_across_the_cut_cannot_be_split():
    from mstar.graph import Call, GraphEdge, GraphNode, ModelGraph, PartitionTopology

    g = ModelGraph(
        name="views",
        nodes=[
            GraphNode("a", inputs=["x"], outputs=["y"], engine="ar"),
            GraphNode("b", inputs=["x"], outputs=["y"], engine="ar", module="a", kv_from="a"),
        ],
        edges=[GraphEdge("input.x", "a.x"), GraphEdge("a.y", "b.x"), GraphEdge("b.y", "output.y")],
        walks={"w": Call("a")},
        next_walk=lambda s: None,
        topology=PartitionTopology({"p": ["a"], "q": ["b"]}),
    )
    with pytest.raises(GraphError, match="'b' in partition 'q' reads the KV of 'a'"):
        split_partition(g, "q")


def _two_partition_graph(walk, edges_extra=(), out_port="y"):
    from mstar.graph import GraphEdge, GraphNode, ModelGraph, PartitionTopology

    return ModelGraph(
        name="g",
        nodes=[GraphNode("a", inputs=["x"], outputs=[out_port]), GraphNode("b", inputs=["x"], outputs=["y"])],
        edges=[
            GraphEdge("input.x", "a.x"),
            GraphEdge(f"a.{out_port}", "b.x"),
            GraphEdge("b.y", "output.y"),
            *edges_extra,
        ],
        walks={"w": walk},
        next_walk=lambda s: None,
        topology=PartitionTopology({"p": ["a"], "q": ["b"]}),
    )


def test_a_walk_across_the_cut_and_colliding_names_are_refused():
    from mstar.graph import Call, GraphEdge, Sequential

    g = _two_partition_graph(Sequential(Call("a"), Call("b")))
    with pytest.raises(
        GraphError, match=r"walk 'w' calls nodes inside partition 'p' \(\['a'\]\) and outside it \(\['b'\]\)"
    ):
        split_partition(g, "p")
    g = _two_partition_graph(Call("a"), out_port="y", edges_extra=[GraphEdge("a.y", "output.a_y")])
    with pytest.raises(GraphError, match="the cut edge from a.y would be named 'a_y', which is already"):
        split_partition(g, "p")
