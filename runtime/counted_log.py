"""Problems of a few kinds, each counted and logged throttled: the first of a kind at once, its
repeats once per period with their count (``mstar.report_throttle``), none lost.

The owner calls ``flush`` at ``next_flush_at`` (an event loop's timer, a selector's timeout),
so a count is said even when the repeats stop coming; ``flush(force=True)`` when it stops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mstar.report_throttle import ReportThrottle

REPORT_PERIOD_S = 5.0


class CountedLog:
    def __init__(
        self,
        log: logging.Logger,
        prefix: str = "",
        period_s: float = REPORT_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counts: dict[str, int] = {}  # kind -> problems noted
        self._log, self._prefix, self._clock = log, prefix, clock
        self._throttle = ReportThrottle(period_s)
        self._levels: dict[str, int] = {}

    def note(self, kind: str, text: str, level: int = logging.WARNING) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._levels[kind] = level
        said = self._throttle.report(kind, text, self._clock())
        if said is not None:
            self._log.log(level, "%s%s", self._prefix, said)

    def next_flush_at(self) -> float | None:
        """When (on ``clock``) a count of repeats is due; None while none is waiting."""
        return self._throttle.next_flush_at()

    def flush(self, force: bool = False) -> None:
        for kind, text in self._throttle.flush(self._clock(), force):
            self._log.log(self._levels[kind], "%s%s", self._prefix, text)
