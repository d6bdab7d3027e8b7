"""Repeated identical problems said once per period, with a count, as ROS's throttled logging does.

A camera that sends 400 bad frames a second must not become 400 log lines and 400
/diagnostics messages a second (each costs the shared executor thread time, and floods
every listener), nor 300 silent connections to the Conductor's control address 300 lines. The first report of a kind goes out at once; repeats within ``period_s``
are counted, and the next one after the period goes out with the count
("... (37 more like this in the last 5.0 s)"); ``flush`` says a pending count when the
repeats stop, so nothing is lost silently. Time is passed in, so this is testable alone.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class _Kind:
    last_said: float
    suppressed: int = 0
    last_text: str = ""


class ReportThrottle:
    def __init__(self, period_s: float = 5.0) -> None:
        if period_s < 0:
            raise ValueError(f"period_s must be >= 0, got {period_s}")
        self.period_s = period_s
        self._kinds: dict[Hashable, _Kind] = {}

    def report(self, key: Hashable, text: str, now: float) -> str | None:
        """The text to say now (with the count of repeats it stands for), or None: counted, said later."""
        kind = self._kinds.get(key)
        if kind is None:
            self._kinds[key] = _Kind(now)
            return text
        if now - kind.last_said < self.period_s:
            kind.suppressed += 1
            kind.last_text = text
            return None
        said = self._with_count(text, kind.suppressed, now - kind.last_said)
        kind.last_said, kind.suppressed, kind.last_text = now, 0, ""
        return said

    def flush(self, now: float, force: bool = False) -> list[tuple[Hashable, str]]:
        """(key, text) of every kind whose period ran out with repeats not yet said (``force``: every
        kind with repeats not yet said, as when stopping)."""
        out = []
        for key, kind in self._kinds.items():
            if kind.suppressed and (force or now - kind.last_said >= self.period_s):
                out.append((key, self._with_count(kind.last_text, kind.suppressed - 1, now - kind.last_said)))
                kind.last_said, kind.suppressed, kind.last_text = now, 0, ""
        return out

    def next_flush_at(self) -> float | None:
        """When ``flush`` will have something to say (None: no repeats are waiting)."""
        return min((k.last_said + self.period_s for k in self._kinds.values() if k.suppressed), default=None)

    @staticmethod
    def _with_count(text: str, repeats: int, span_s: float) -> str:
        return text if repeats <= 0 else f"{text} ({repeats} more like this in the last {span_s:.1f} s)"
