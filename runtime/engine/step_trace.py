"""A record of the device thread's engine steps, for a bench that asks where a request's time went.

Off unless a bench turns it on (``device_thread().trace = StepTrace()``): each engine step is then kept
as (start, end, loop, engine, class of its due work), on ``time.perf_counter``'s clock. ``overlap``
splits a window (a control chunk's request to its result) into the device time each class's steps
took inside it; what is left is time the device was idle or between steps.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from mstar.priority import Priority

clock = time.perf_counter


@dataclass(frozen=True)
class StepRecord:
    start: float
    end: float
    loop: str  # the Worker's DeviceLoop
    engine: str  # the engine's name (its type where it has none)
    cls: Priority | None  # the class of the work it stepped (None: unclassed)


class StepTrace:
    """The last ``keep`` engine steps."""

    def __init__(self, keep: int = 500_000) -> None:
        self.records: deque[StepRecord] = deque(maxlen=keep)

    def add(self, start: float, end: float, loop: str, engine: object, cls: Priority | None) -> None:
        name = getattr(engine, "name", None) or type(engine).__name__
        self.records.append(StepRecord(start, end, loop, str(name), cls))

    def overlap(self, start: float, end: float, by: str = "class") -> dict[str, float]:
        """Seconds of ``[start, end]`` the steps took, by class (keys: the class's name, "unclassed") or
        by ``"engine"`` (its name), and "idle": the rest of the window."""
        out: dict[str, float] = {}
        for r in list(self.records):
            took = min(end, r.end) - max(start, r.start)
            if took > 0:
                key = r.engine if by == "engine" else r.cls.name.lower() if r.cls is not None else "unclassed"
                out[key] = out.get(key, 0.0) + took
        out["idle"] = max(0.0, (end - start) - sum(out.values()))
        return out
