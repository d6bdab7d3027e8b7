"""AwaitInput: a Walk waits for a streamed input's end, the chunks cut from it and those of the streams
their consumers feed, then reads what they made; a stream that ends empty or fails fails its request."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request
from mstar.conductor.stream_input import SampleStream, StreamInput
from mstar.graph import (
    AwaitInput,
    Call,
    GraphEdge,
    GraphError,
    GraphNode,
    LeftContextChunkPolicy,
    ModelGraph,
    NodeSubmodule,
    PartitionConnection,
    PartitionTopology,
    Sequential,
    StreamingGraphEdge,
    WholeStreamPolicy,
)
from mstar.request import RequestError


class ChunkSums(NodeSubmodule):
    """Per chunk: the sum of its new items (context excluded)."""

    def prepare_inputs(self, calls):
        return {
            "parts": [
                (
                    torch.as_tensor(c.inputs["x"])
                    if not isinstance(c.inputs["x"], list)
                    else torch.stack(c.inputs["x"]),
                    int(c.meta.get("left_context", 0)),
                )
                for c in calls
            ]
        }

    def batch_key(self, call):
        return "sums"

    def forward(self, parts):
        return {"s": [x[ctx:].sum().reshape(1) for x, ctx in parts]}

    def split_outputs(self, outputs, calls):
        return [{"s": s} for s in outputs["s"]]


class Total(NodeSubmodule):
    """The whole stream of per-chunk sums -> their total, and how many chunks made it."""

    def prepare_inputs(self, calls):
        return {"parts": [c.inputs["s"] for c in calls]}

    def batch_key(self, call):
        return "total"

    def forward(self, parts):
        return {"pairs": [(torch.as_tensor(p).sum().reshape(1), torch.tensor([len(p)])) for p in parts]}

    def split_outputs(self, outputs, calls):
        return [{"total": t, "chunks": n} for t, n in outputs["pairs"]]


class PlusBias(NodeSubmodule):
    def forward(self, total, bias):
        return {"y": total + bias}


def graph() -> ModelGraph:
    return ModelGraph(
        name="listen",
        nodes=[
            GraphNode("sums", ["x"], ["s"]),
            GraphNode("total", ["s"], ["total", "chunks"]),
            GraphNode("after", ["total", "bias"], ["y"]),
        ],
        edges=[
            StreamingGraphEdge("input.x", "sums.x", target_partition="p"),
            StreamingGraphEdge("sums.s", "total.s", target_partition="p"),
            GraphEdge("total.total", "after.total"),
            GraphEdge("input.bias", "after.bias"),
            GraphEdge("total.chunks", "output.chunks"),
            GraphEdge("after.y", "output.y"),
        ],
        walks={"answer": Sequential(AwaitInput("x"), Call("after"))},
        next_walk=lambda s: None if s.walks_done else "answer",
        topology=PartitionTopology(
            {"p": ["sums", "total", "after"]},
            [
                PartitionConnection("input", "p", LeftContextChunkPolicy(4, 1, edges=True)),
                PartitionConnection("p", "p", WholeStreamPolicy()),
            ],
        ),
    )


def modules():
    return {"sums": ChunkSums(), "total": Total(), "after": PlusBias()}


def test_the_walk_reads_what_the_whole_stream_made():
    async def main():
        async with Conductor(graph(), modules()) as c:
            feed = StreamInput()
            run = c.submit(Request(inputs={"x": feed, "bias": torch.tensor([100.0])}))
            values = [float(v) for v in range(1, 11)]
            for v in values[:5]:
                feed.put(torch.tensor(v))
            await asyncio.sleep(0.2)
            state = next(iter(c._states.values()))
            ran_early = state.streams["input.x ~> sums.x [p]"].cursor  # a chunk of 4 ran while the stream went on
            for v in values[5:]:
                feed.put(torch.tensor(v))
            feed.close()
            out = await run.collect()
            return out, ran_early, sum(values)

    out, ran_early, total = asyncio.run(main())
    assert ran_early == 4
    # chunks [0,4) [3,8) (1 of context) and the final [7,10): each item summed once
    assert float(out["y"][0]) == total + 100.0
    assert int(out["chunks"][0]) == 3


def test_a_stream_that_ends_empty_or_fails_fails_its_request_only():
    async def main():
        async with Conductor(graph(), modules()) as c:
            empty, failing, good = StreamInput(), StreamInput(), StreamInput()
            runs = [c.submit(Request(inputs={"x": f, "bias": torch.tensor([0.0])})) for f in (empty, failing, good)]
            empty.close()
            failing.put(torch.tensor(1.0))
            failing.fail("the sensor went away")
            for v in (1.0, 2.0):
                good.put(torch.tensor(v))
            good.close()
            results = []
            for run in runs:
                try:
                    results.append(float((await run.collect())["y"][0]))
                except RequestError as exc:
                    results.append(str(exc))
            return results

    empty, failing, good = asyncio.run(main())
    assert "ended with nothing" in empty
    assert "the sensor went away" in failing
    assert good == 3.0


def test_await_input_names_a_streamed_input():
    with pytest.raises(GraphError, match="awaits 'bias', which is no streamed input"):
        g = graph()
        ModelGraph(
            name=g.name,
            nodes=g.nodes,
            edges=g.edges,
            walks={"answer": Sequential(AwaitInput("bias"), Call("after"))},
            next_walk=g.next_walk,
            topology=g.topology,
        )


def test_sample_stream_cuts_items_of_one_size_and_the_rest_last():
    async def main():
        s = SampleStream(4, max_samples=20)
        s.push(torch.arange(3.0))
        s.push(torch.arange(3.0, 10.0))
        s.close()
        return [t.tolist() async for t in s.items()]

    assert asyncio.run(main()) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    s = SampleStream(4, max_samples=5)
    with pytest.raises(ValueError, match="over its limit of 5 samples"):
        s.push(torch.zeros(6))
    assert s.closed  # it failed: its request fails with the message
