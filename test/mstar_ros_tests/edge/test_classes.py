"""mstar_ros.edge.classes: a front-end's Conductor keeps each request's own class unless the edge config
sets one for the front-end, which then covers every node call; its class_limits reach its Conductor."""

from __future__ import annotations

import asyncio
import types

import pytest

from mstar.priority import Priority
from mstar_ros.edge.classes import DEFAULT_CLASS, class_overrides, classed_conductor
from support.conductor_helpers import LM, config, req, run
from support.toy_graphs import lm_graph

C, IA, B = Priority.CONTROL, Priority.INTERACTIVE, Priority.BATCH


def test_a_set_class_covers_every_node_and_none_overrides_nothing():
    graph = types.SimpleNamespace(nodes=[types.SimpleNamespace(name="vit"), types.SimpleNamespace(name="llm")])
    assert class_overrides(graph, "batch") == {"vit": "batch", "llm": "batch"}
    assert class_overrides(graph, "") == {}
    assert DEFAULT_CLASS == {"pi05": "control", "voice": "interactive", "images": "batch"}


@pytest.mark.parametrize("cls, want", [("", [C, C, B, B]), ("interactive", [IA, IA, IA, IA])])
def test_calls_carry_their_requests_class_unless_the_front_end_sets_one(cls, want):
    async def main():
        async with classed_conductor(lm_graph(), {"llm": LM}, config(), cls) as conductor:
            seen: list[Priority] = []
            worker = conductor.workers[0]
            execute = worker.execute
            worker.execute = lambda msg, reply: (seen.append(msg.priority), execute(msg, reply))[1]
            for rid, priority in (("chunk", "control"), ("image", "batch")):
                await conductor.submit(req([3, 4], max_tokens=2, request_id=rid, priority=priority)).collect()
            return seen

    assert run(main()) == want  # a prefill and a decode call per request


def test_a_front_ends_class_limits_reach_its_conductor():
    conductor = classed_conductor(lm_graph(), {"llm": LM}, config(), "", {"batch": 1})
    assert conductor.class_limits.limits == {B: 1}


def test_a_front_ends_class_is_the_class_its_limits_count():
    """voice: {priority: batch, class_limits: {batch: 1}} caps voice: its interactive requests turn batch."""

    async def main():
        async with classed_conductor(lm_graph(), {"llm": LM}, config(), "batch", {"batch": 1}) as conductor:
            requests = [req([3, 4], max_tokens=2, request_id=f"r{i}") for i in range(2)]
            streams = [conductor.submit(r) for r in requests]
            await asyncio.sleep(0)  # both reach their class's turn
            stats = conductor.class_limits.stats()
            outs = [await s.collect() for s in streams]
            return [r.priority for r in requests], stats, outs

    classes, stats, outs = run(main())
    assert classes == [B, B]
    assert stats["batch"] == {"running": 1, "waiting": 1, "limit": 1}
    assert stats["interactive"]["running"] == 0
    assert all(len(o["token"]) == 2 for o in outs)
