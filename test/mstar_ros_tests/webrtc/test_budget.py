"""The budget requests share (bodies' bytes, images' pixels): arrival order, waiting, refusing, giving back."""

from __future__ import annotations

import asyncio

import pytest

from mstar_ros.webrtc.budget import BudgetBusy, OverBudget, SharedBudget


def test_requests_take_their_turn_in_arrival_order_and_give_back_what_they_held():
    async def main():
        budget, order = SharedBudget(10, "pixels", wait_s=5.0), []

        async def hold(name: str, amount: int, for_s: float) -> None:
            async with budget.reserve(amount):
                order.append((name, budget.held))
                await asyncio.sleep(for_s)

        first = asyncio.ensure_future(hold("a", 8, 0.2))
        await asyncio.sleep(0.01)
        # b (5) waits for a; c (1) would fit now, but arrives after b and must not pass it (no starving b)
        rest = [asyncio.ensure_future(hold("b", 5, 0.05)), asyncio.ensure_future(hold("c", 1, 0.05))]
        await asyncio.sleep(0.01)
        waiting = (len(budget._queue), budget.held)
        await asyncio.gather(first, *rest)
        return order, waiting, budget.held

    order, waiting, left = asyncio.run(main())
    assert waiting == (2, 8)
    assert order == [("a", 8), ("b", 6), ("c", 6)]  # a's release lets b, then c, in: both fit together
    assert left == 0


def test_too_much_is_refused_at_once_and_a_full_budget_answers_busy_after_its_wait():
    async def main():
        budget = SharedBudget(10, "pixels of images being decoded", wait_s=0.1)
        with pytest.raises(OverBudget, match="11 pixels of images being decoded is over the 10"):
            async with budget.reserve(11):
                pass
        async with budget.reserve(7):
            with pytest.raises(BudgetBusy, match="busy with other requests' pixels"):
                async with budget.reserve(4):
                    pass
            assert not budget._queue  # the refused one left the queue
            async with budget.reserve(3):  # what still fits goes ahead
                assert budget.held == 10
        return budget.held

    assert asyncio.run(main()) == 0


def test_a_reservation_shrinks_to_what_it_needs_and_a_cancelled_waiter_leaves_nothing_held():
    async def main():
        budget = SharedBudget(100, "bytes", wait_s=5.0)
        granted = asyncio.Event()

        async def wait_for_50() -> None:
            async with budget.reserve(50):
                granted.set()
                await asyncio.sleep(0.05)

        async with budget.reserve(100) as held:
            waiter = asyncio.ensure_future(wait_for_50())
            await asyncio.sleep(0.01)
            assert not granted.is_set()
            held.shrink_to(40)  # a chunked body read: 40 bytes, not its route's limit
            await asyncio.wait_for(granted.wait(), 1)
            both = budget.held
        await waiter
        stuck = SharedBudget(10, "bytes", wait_s=5.0)

        async def wait_for_5() -> None:
            async with stuck.reserve(5):
                pass

        async with stuck.reserve(10):
            pending = asyncio.ensure_future(wait_for_5())
            await asyncio.sleep(0.01)
            pending.cancel()
            await asyncio.sleep(0.01)
        return both, budget.held, stuck.held, len(stuck._queue)

    assert asyncio.run(main()) == (90, 0, 0, 0)
