"""A streaming edge into a running Loop (a fed input): the producer's rows reach the consumer's Loop as
they are made. The consumer's output equals what it gives when it starts after the producer is done
(every row there), however the rows' arrival interleaves with its steps; it waits for a row it needs
rather than read past the end; cancelling or a bad row frees everything."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mstar.conductor import Conductor, Request
from mstar.graph import GraphEdge, GraphNode
from mstar.graph.validation import GraphError
from mstar.sampling_params import SamplingParams
from support.conductor_helpers import config, run, until
from support.toy_graphs import fed_loop_graph
from support.toy_models import FedLM, RowsLM


def request(i: int, **meta) -> Request:
    g = torch.Generator().manual_seed(i)
    prompt, prompt2 = torch.randint(1, 97, (3 + i,), generator=g), torch.randint(1, 97, (2 + i % 3,), generator=g)
    return Request(
        {"prompt": prompt, "prompt2": prompt2}, SamplingParams(), meta={"produce": 6 + i, "consume": 9 + i, **meta}
    )


def modules(delay_s: float = 0.0) -> dict:
    return {"producer": RowsLM(delay_s=delay_s), "consumer": FedLM()}


def stats(c: Conductor, name: str) -> dict:
    return c.stats()["workers"][0][f"ar:{name}"]


@pytest.mark.parametrize("delay_s", [0.0, 0.01])
def test_the_consumer_reading_rows_as_they_come_equals_it_reading_them_all_at_once(delay_s):
    async def main():
        async with Conductor(fed_loop_graph(), modules(delay_s), config=config()) as c:
            idle = c.kv_blocks_used()
            after = [await c.submit(request(i, after=True)).collect() for i in range(4)]
            waits_before = stats(c, "consumer")["feed_waits"]
            together = await asyncio.gather(*(c.submit(request(i)).collect() for i in range(4)))
            await c.wait_idle()
            return after, together, stats(c, "consumer")["feed_waits"] - waits_before, c.kv_blocks_used() == idle

    after, together, waits, freed = run(main())
    for a, t in zip(after, together):
        assert [int(x) for x in t["text"]] == [int(x) for x in a["text"]] and len(a["text"]) > 1
        assert [int(x) for x in t["spoken"]] == [int(x) for x in a["spoken"]] and len(a["spoken"]) > 2
    if delay_s:  # a slow producer: the consumer had to wait for rows it needed
        assert waits > 0
    assert freed


def test_the_consumer_starts_before_the_producer_ends():
    """Its first tokens come out while the producer is still making rows (a slow producer)."""

    async def main():
        async with Conductor(fed_loop_graph(), modules(delay_s=0.02), config=config()) as c:
            order = []
            async for out in c.submit(request(1, produce=12, consume=4)):
                order.append(out.name)
            return order

    order = run(main())
    assert order.index("spoken") < len(order) - 1 - order[::-1].index("text")  # a spoken token before the last text


def test_cancelling_while_the_consumer_waits_for_rows_frees_both_loops():
    async def main():
        async with Conductor(fed_loop_graph(), modules(delay_s=0.05), config=config()) as c:
            idle = c.kv_blocks_used()
            stream = c.submit(request(2, produce=40, consume=40))
            await until(
                lambda: stats(c, "consumer")["sequences"] == 1 and stats(c, "producer")["sequences"] == 1,
                what="both loops running",
            )
            await c.cancel(stream.request_id)
            other = await c.submit(request(0, after=True)).collect()
            await c.wait_idle()
            return other, c.kv_blocks_used() == idle

    other, freed = run(main())
    assert len(other["spoken"]) > 0 and freed


def test_a_fed_input_needs_one_streaming_edge_from_step_rows():
    graph = fed_loop_graph()
    edges = [e for e in graph.edges if not str(e).startswith("producer.step_rows")]
    edges.append(GraphEdge("producer.rows", "consumer.text"))
    with pytest.raises(GraphError, match="fed input consumer.text needs exactly one streaming edge"):
        type(graph)(
            name=graph.name,
            nodes=graph.nodes,
            edges=edges,
            walks=graph.walks,
            topology=graph.topology,
            next_walk=graph.next_walk,
        )
    with pytest.raises(ValueError, match="fed inputs"):
        GraphNode("enc", inputs=["x"], outputs=["y"], fed_inputs=["x"])  # a stateless node has no running Loop


def test_a_fed_input_whose_producer_is_not_in_the_walk_is_closed_not_waited_for():
    """The consumer alone (a walk without the producer): its text ends at once, it does not hang."""
    from mstar.graph import DynamicLoop

    graph = fed_loop_graph()
    walks = dict(graph.walks, alone=DynamicLoop("consumer", trip_count=lambda s: 5))
    graph = type(graph)(
        name=graph.name,
        nodes=graph.nodes,
        edges=graph.edges,
        walks=walks,
        topology=graph.topology,
        next_walk=lambda s: None if s.last_walk else "alone",
    )

    async def main():
        async with Conductor(graph, modules(), config=config()) as c:
            return await asyncio.wait_for(c.submit(request(0)).collect(), 10)

    assert len(run(main())["spoken"]) == 5
