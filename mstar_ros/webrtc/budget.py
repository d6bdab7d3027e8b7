"""A budget of some resource (bytes of request bodies, pixels being decoded) shared by every request.

A request reserves what it will hold before it holds it, waits its turn for at most ``wait_s`` while
others hold the rest, and gives it back when done. Requests are served in arrival order, so one
client's flood queues behind itself and a small request is never starved by large ones: a request
larger than the whole budget is refused at once, one that cannot get its share in time gets
``BudgetBusy`` (the gateway answers 503).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class BudgetBusy(Exception):
    pass


class OverBudget(ValueError):
    pass


class SharedBudget:
    def __init__(self, total: int, what: str, wait_s: float = 10.0) -> None:
        if total <= 0:
            raise ValueError(f"{what}: the budget must be positive, got {total}")
        self.total, self.what, self.wait_s = total, what, wait_s
        self.held = 0
        self._queue: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def free(self) -> int:
        return self.total - self.held

    @contextlib.asynccontextmanager
    async def reserve(self, amount: int) -> AsyncIterator[Reservation]:
        """Hold ``amount`` for the body of the ``async with`` (more as ``grow`` takes it, less once
        ``shrink_to`` says so)."""
        await self._take(amount)
        reservation = Reservation(self, amount)
        try:
            yield reservation
        finally:
            self._give_back(reservation.amount)

    async def _take(self, amount: int, already: int = 0) -> None:
        """Wait in line for ``amount`` (a request holding ``already`` may hold ``total`` in all)."""
        if already + amount > self.total:
            raise OverBudget(f"{already + amount} {self.what} is over the {self.total} the server holds at once")
        if not self._queue and amount <= self.free:
            self.held += amount
            return
        turn = asyncio.get_running_loop().create_future()
        self._queue.append((amount, turn))
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.wait_s)
        except asyncio.TimeoutError:
            if not turn.done():
                self._queue.remove((amount, turn))
                self._wake()
                raise BudgetBusy(f"the server is busy with other requests' {self.what}: try again") from None
        except asyncio.CancelledError:
            if turn.done():  # granted as we were cancelled: give it back
                self._give_back(amount)
            else:
                self._queue.remove((amount, turn))
                self._wake()
            raise

    def _give_back(self, amount: int) -> None:
        self.held -= amount
        self._wake()

    def _wake(self) -> None:
        """Grant waiting requests in arrival order while the head of the queue fits."""
        while self._queue and self._queue[0][0] <= self.free:
            amount, turn = self._queue.popleft()
            if not turn.done():
                self.held += amount
                turn.set_result(None)


class Reservation:
    """What a request holds of a budget: it may take more as it goes (a body, as its bytes arrive) and
    learn that it needs less."""

    def __init__(self, budget: SharedBudget, amount: int) -> None:
        self.budget, self.amount = budget, amount

    async def grow(self, amount: int) -> None:
        """Take ``amount`` more, waiting in line as ``reserve`` does (BudgetBusy, OverBudget alike)."""
        await self.budget._take(amount, already=self.amount)
        self.amount += amount

    def shrink_to(self, amount: int) -> None:
        if 0 <= amount < self.amount:
            self.budget._give_back(self.amount - amount)
            self.amount = amount
