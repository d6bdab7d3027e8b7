"""A bounded share for skipped classes: due work that more urgent work keeps waiting still gets steps.

The device thread serves the most urgent class first (mstar.engine.device_round). Alone, that
starves: four voice peers that kept the device busy left a BAGEL image job at 0 images
(``bench mixed --quick``, 1.5 s). So a
Worker's due work of a less urgent class than the one being served ("skipped") takes one step
anyway once it has waited ``wait_s`` (``EngineConfig.starvation_wait_ms``) since it was first
skipped or since its last such step, and never more than ``share`` of the device
(``EngineConfig.starved_share``): after such a step took d seconds the next waits at least
d * (1 / share - 1).

A control call still waits at most one step of lower-class work: at most one such step per round,
and none in a round whose most urgent work arrived while a less urgent step ran (that call has had
its one step of lower-class work already).

Why milliseconds and a share, not N rounds: a round lasts 0.1 ms (a codec batch) or 2 s (a BAGEL
flow step at the bench preset on 2 cores), so a count of rounds bounds neither the batch job's wait
nor what it costs the urgent classes; a wait in time and a share of device time bound both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mstar.priority import Priority

DEFAULT_WAIT_MS = 200.0  # a skipped batch job still steps 5 times a second when its steps are short
DEFAULT_SHARE = 0.05  # and takes at most 5% of the device when they are long (control p95 goal: x1.25)


@dataclass(frozen=True)
class StarvationLimit:
    """How long a Worker's skipped due work waits before it takes one step, and its largest share."""

    wait_s: float
    share: float

    @classmethod
    def of(cls, wait_ms: float | None, share: float) -> StarvationLimit | None:
        """None (strict priority: skipped work waits as long as more urgent work is due) for 0 / None
        or a share of 0."""
        if not wait_ms or share <= 0:
            return None
        return cls(wait_s=wait_ms / 1000, share=min(share, 1.0))


DEFAULT_LIMIT = StarvationLimit.of(DEFAULT_WAIT_MS, DEFAULT_SHARE)


class StarvationGuard:
    """Remembers since when each loop's skipped classes have waited; picks one that is overdue.

    A loop (a Worker's DeviceLoop) takes part when it has ``starvation`` (a StarvationLimit; None or
    missing: strict) and ``due_classes()``; the device round steps the pick with ``step_class``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._since: dict[tuple[object, Priority], float] = {}  # skipped since (or since its last step)
        self._not_before: dict[tuple[object, Priority], float] = {}  # after a long step: its share's wait
        self._last_served: Priority | None = None  # the least urgent class the last round stepped

    def pick(self, loops: Sequence[object], limit: Priority) -> tuple[object, Priority] | None:
        """Notes which classes are skipped now (less urgent than ``limit``) and returns the overdue
        (loop, class) that has waited longest, or None."""
        now = self.clock()
        since: dict[tuple[object, Priority], float] = {}
        overdue: list[tuple[float, object, Priority]] = []
        for loop in loops:
            bound: StarvationLimit | None = getattr(loop, "starvation", None)
            if bound is None:
                continue
            for cls in loop.due_classes():  # type: ignore[attr-defined]
                if cls <= limit:
                    continue
                key = (loop, cls)
                start = since[key] = self._since.get(key, now)
                if now - start >= bound.wait_s and now >= self._not_before.get(key, now):
                    overdue.append((start, loop, cls))
        self._since = since
        live = {id(loop) for loop in loops}
        self._not_before = {k: t for k, t in self._not_before.items() if id(k[0]) in live}
        if not overdue or (self._last_served is not None and limit < self._last_served):
            return None  # the most urgent due call arrived during a less urgent step: it goes next
        _, loop, cls = min(overdue, key=lambda item: item[0])
        return loop, cls

    def stepped(self, loop: object, cls: Priority, took_s: float) -> None:
        """``loop``'s skipped ``cls`` took a step of ``took_s`` seconds: its wait starts again."""
        now = self.clock()
        bound: StarvationLimit = loop.starvation  # type: ignore[attr-defined]
        self._since[(loop, cls)] = now
        self._not_before[(loop, cls)] = now + took_s * (1 / bound.share - 1)

    def round_ended(self, served: Priority | None) -> None:
        """The least urgent class the round stepped (None: it stepped nothing)."""
        self._last_served = served
