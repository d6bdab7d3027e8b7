"""Fake engines and engine groups for the device round (mstar.engine.device_round): no device thread,
no torch. Each step pops one unit of due work, logs it and advances a fake clock by its cost."""

from __future__ import annotations

import threading

from mstar.engine.device_round import engines_to_step, most_urgent_of, next_of_class
from mstar.engine.starvation import StarvationLimit
from mstar.priority import Priority

IA = Priority.INTERACTIVE


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeEngine:
    """Steppable: ``work`` holds the classes of its due steps; each step does one and logs it."""

    def __init__(
        self,
        name: str,
        work: list[Priority],
        log: list[str],
        classes: bool = True,
        clock: FakeClock | None = None,
        cost_s: float = 0.0,
    ) -> None:
        self.name, self.work, self.log, self.classes = name, list(work), log, classes
        self.clock, self.cost_s = clock, cost_s
        self.wake = threading.Event()
        self.pending_only: list[Priority] = []  # queued, not due (waiting to be batched)
        self.on_step = None  # something that arrives while this step runs

    def poll(self) -> None:
        pass

    def has_work(self) -> bool:
        return bool(self.work)

    def has_pending(self) -> bool:
        return bool(self.work or self.pending_only)

    def most_urgent(self, pending: bool = False) -> Priority | None:
        queued = self.work + (self.pending_only if pending else [])
        return (min(queued) if self.classes else IA) if queued else None

    def step(self, limit: Priority | None = None) -> None:
        if self.work:
            self.log.append(f"{self.name}:{self.work.pop(0).label}")
        else:
            self.log.append(f"{self.name}:batched")
            self.pending_only.clear()
        if self.clock is not None:
            self.clock.now += self.cost_s
        if self.on_step is not None:
            self.on_step()


class FakeGroup:
    """RoundLoop over engines, as a Worker's DeviceLoop groups them (without the device thread)."""

    def __init__(self, *engines: FakeEngine, starvation: StarvationLimit | None = None) -> None:
        self.engines = list(engines)
        self.name = "+".join(e.name for e in engines)
        self.starvation = starvation
        self._next = 0

    def poll(self) -> None:
        pass

    def most_urgent(self) -> Priority | None:
        return most_urgent_of([e.most_urgent() for e in self.engines])

    def due_classes(self) -> set[Priority]:
        return {c for e in self.engines if (c := e.most_urgent()) is not None}

    def step_once(self, limit: Priority | None = None) -> bool:
        busy = engines_to_step(self.engines, limit)
        for engine in busy:
            engine.step(limit)
        return bool(busy)

    def step_class(self, cls: Priority) -> bool:
        i = next_of_class(self.engines, cls, self._next)
        if i is None:
            return False
        self._next = i + 1
        self.engines[i].step(cls)
        return True
