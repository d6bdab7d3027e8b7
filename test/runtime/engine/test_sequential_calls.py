"""A stateless node with ``sequential_calls`` (state kept between a request's chunks): the engine runs each
request's calls one at a time and in order, batching different requests together, and frees the state
when the request ends, whether it finished or was cancelled."""

from __future__ import annotations

import asyncio

import torch

from mstar.conductor import Conductor, Request
from mstar.conductor.stream_input import StreamInput
from mstar.graph import (
    AwaitInput,
    GraphEdge,
    GraphNode,
    LeftContextChunkPolicy,
    ModelGraph,
    NodeSubmodule,
    PartitionConnection,
    PartitionTopology,
    StreamingGraphEdge,
)


class RunningSum(NodeSubmodule):
    """Per chunk: the sum of the request's items so far (its state: the sum before the chunk)."""

    sequential_calls = True

    def __init__(self) -> None:
        super().__init__()
        self.totals: dict[str, float] = {}
        self.batches: list[list[tuple[str, int]]] = []  # (request, call index) of each batch
        self.released: list[str] = []

    def prepare_inputs(self, calls):
        self.batches.append([(c.request_id, c.index) for c in calls])
        return {"chunks": [torch.stack(list(c.inputs["x"])) for c in calls], "ids": [c.request_id for c in calls]}

    def batch_key(self, call):
        return "sum"  # any two calls may share a batch, as far as shapes go

    def forward(self, chunks, ids):
        out = []
        for rid, chunk in zip(ids, chunks):
            self.totals[rid] = self.totals.get(rid, 0.0) + float(chunk.sum())
            out.append(torch.tensor([self.totals[rid]]))
        return {"total": out}

    def release(self, request_id: str) -> None:
        self.released.append(request_id)
        self.totals.pop(request_id, None)


def graph() -> ModelGraph:
    return ModelGraph(
        name="running_sum",
        nodes=[GraphNode("acc", ["x"], ["total"])],
        edges=[StreamingGraphEdge("input.x", "acc.x", target_partition="p"), GraphEdge("acc.total", "output.total")],
        walks={"listen": AwaitInput("x")},
        next_walk=lambda s: None if s.walks_done else "listen",
        topology=PartitionTopology({"p": ["acc"]}, [PartitionConnection("input", "p", LeftContextChunkPolicy(2, 0))]),
    )


async def released(acc: RunningSum, requests: int) -> None:
    """The engine hears of a request's end after its caller does: wait for it (at most 5 s)."""
    for _ in range(500):
        if len(acc.released) >= requests:
            return
        await asyncio.sleep(0.01)


def test_a_requests_chunks_run_in_order_one_at_a_time_and_its_state_is_freed():
    acc = RunningSum()

    async def main():
        async with Conductor(graph(), {"acc": acc}) as c:
            feeds = [StreamInput(), StreamInput()]
            runs = [c.submit(Request(inputs={"x": f})) for f in feeds]
            for i, feed in enumerate(feeds):  # every chunk is there at once: the Conductor sends them all together
                for v in range(12):
                    feed.put(torch.tensor(float(v + 100 * i)))
                feed.close()
            outs = await asyncio.gather(*(r.collect() for r in runs))
            await released(acc, 2)
            return outs

    outs = asyncio.run(main())
    for i, out in enumerate(outs):
        items = [float(v + 100 * i) for v in range(12)]
        assert [float(t) for t in out["total"]] == [sum(items[: k + 2]) for k in range(0, 12, 2)]
    for batch in acc.batches:  # never two calls of one request in a batch
        assert len({rid for rid, _ in batch}) == len(batch), batch
    per_request: dict[str, list[int]] = {}
    for batch in acc.batches:
        for rid, index in batch:
            per_request.setdefault(rid, []).append(index)
    assert sorted(per_request.values()) == [list(range(6))] * 2
    assert any(len(b) == 2 for b in acc.batches)  # the two requests did share batches
    assert sorted(acc.released) == sorted(per_request) and acc.totals == {}


def test_a_cancelled_requests_state_is_freed():
    acc = RunningSum()

    async def main():
        async with Conductor(graph(), {"acc": acc}) as c:
            feed = StreamInput()
            run = c.submit(Request(inputs={"x": feed}))
            for v in range(4):
                feed.put(torch.tensor(float(v)))
            for _ in range(200):
                if acc.totals:
                    break
                await asyncio.sleep(0.01)
            kept = dict(acc.totals)
            await c.cancel(run.request_id)
            await released(acc, 1)
            return kept

    kept = asyncio.run(main())
    assert list(kept.values()) == [6.0]  # both chunks of the four items ran, in order
    assert acc.released == list(kept) and acc.totals == {}
