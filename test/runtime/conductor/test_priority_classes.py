"""Priority classes at the Conductor: every call carries its request's class (or an override), and
class_limits queue requests over a class's in-flight limit, first come first served, cancellable."""

from __future__ import annotations

import asyncio

import pytest

from mstar.conductor import Conductor, RequestCancelled
from mstar.conductor.class_limits import ClassLimits, parse_class_limits
from mstar.priority import Priority
from support.conductor_helpers import LM, config, ref, req, run, toks, until
from support.toy_graphs import lm_graph

C, IA, B = Priority.CONTROL, Priority.INTERACTIVE, Priority.BATCH


def record_calls(conductor: Conductor) -> list[tuple[str, str, Priority]]:
    """(request, node, class) of every call the Worker receives."""
    seen: list[tuple[str, str, Priority]] = []
    worker = conductor.workers[0]
    execute = worker.execute

    def spy(msg, reply):
        seen.append((msg.request_id.rpartition("#")[0], msg.index, msg.priority))
        execute(msg, reply)

    worker.execute = spy  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize(
    "options,want",
    [
        ({}, [C, C]),
        ({"priorities": {"decode": "batch"}}, [C, B]),  # a walk's override
        ({"priorities": {"llm": "interactive", "decode": "batch"}}, [IA, IA]),  # a node's wins over its walk's
        ({"config": config(priority_classes=False)}, [IA, IA]),  # classes off: every call alike
    ],
)
def test_each_call_carries_its_class(options, want):
    async def main():
        async with Conductor(lm_graph(), {"llm": LM}, **{"config": config(), **options}) as c:
            seen = record_calls(c)
            out = await c.submit(req([3, 4, 5], max_tokens=4, request_id="r", priority="control")).collect()
            return out, seen

    out, seen = run(main())
    assert toks(out) == ref((3, 4, 5), 4)
    assert [cls for _, _, cls in seen] == want


def test_unknown_override_names_are_refused():
    with pytest.raises(ValueError, match="'vae' is neither a node nor a walk"):
        Conductor(lm_graph(), {"llm": LM}, config=config(), priorities={"vae": "batch"})
    with pytest.raises(ValueError, match="priorities.decode"):
        Conductor(lm_graph(), {"llm": LM}, config=config(), priorities={"decode": "later"})


def test_class_limits_parse_with_errors_naming_the_class():
    assert parse_class_limits({"batch": 1, 0: 4}) == {B: 1, C: 4}
    with pytest.raises(ValueError, match="class_limits.batch"):
        parse_class_limits({"batch": 0})
    with pytest.raises(ValueError, match="class_limits"):
        parse_class_limits({"later": 1})


def test_limits_queue_in_order_and_a_freed_slot_goes_to_the_next_in_line():
    async def main():
        limits = ClassLimits({B: 1})
        order: list[str] = []

        async def job(name: str, cls: Priority, hold: asyncio.Event) -> None:
            await limits.enter(cls)
            order.append(name)
            await hold.wait()
            limits.leave(cls)

        holds = {n: asyncio.Event() for n in "abcd"}
        tasks = {n: asyncio.ensure_future(job(n, B if n != "d" else C, holds[n])) for n in "abcd"}
        await asyncio.sleep(0.01)
        assert order == ["a", "d"]  # one batch at a time; control has no limit
        assert limits.stats()["batch"] == {"running": 1, "waiting": 2, "limit": 1}
        tasks["b"].cancel()  # cancelled while it waits: it leaves the line
        await asyncio.sleep(0.01)
        assert limits.waiting(B) == 1
        holds["a"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "d", "c"]
        holds["c"].set(), holds["d"].set()
        await asyncio.gather(tasks["a"], tasks["c"], tasks["d"])
        return limits.stats()

    assert run(main())["batch"] == {"running": 0, "waiting": 0, "limit": 1}


def test_requests_over_the_limit_wait_and_can_be_cancelled_while_waiting():
    async def main():
        async with Conductor(lm_graph(), {"llm": LM}, config=config(), class_limits={"batch": 1}) as c:
            streams = {n: c.submit(req([1, 2, n], max_tokens=24, request_id=f"b{n}", priority=B)) for n in (1, 2, 3)}
            control = c.submit(req([7, 8], max_tokens=3, request_id="ctl", priority=C))
            await until(lambda: c.stats()["classes"]["batch"]["waiting"] == 2, what="two batch requests waiting")
            assert c.stats()["classes"]["batch"]["running"] == 1
            await c.cancel("b2")
            with pytest.raises(RequestCancelled):
                await streams[2].collect()
            assert toks(await control.collect()) == ref((7, 8), 3)  # not held by the batch limit
            got = {n: toks(await streams[n].collect()) for n in (1, 3)}
            await c.wait_idle()
            return got, c.stats()["classes"]["batch"]

    got, batch = run(main())
    assert got == {n: ref((1, 2, n), 24) for n in (1, 3)}
    assert batch == {"running": 0, "waiting": 0, "limit": 1}
