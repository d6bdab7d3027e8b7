"""In-flight limits per priority class: requests over their class's limit wait, first come first served.

``Conductor(class_limits={Priority.BATCH: 1})`` lets one batch request run at a time; the
others wait (they are not refused) and start, in the order they came, when a request of
their class finishes. A waiting request can be cancelled like a running one. Classes
without a limit are only counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Mapping

from mstar.priority import Priority


def parse_class_limits(limits: Mapping[Priority | str | int, int] | None) -> dict[Priority, int]:
    """``{"batch": 1}`` -> ``{Priority.BATCH: 1}``; ValueError naming the bad class or limit."""
    parsed: dict[Priority, int] = {}
    for key, limit in (limits or {}).items():
        cls = Priority.parse(key, "class_limits")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"class_limits.{cls.label}: {limit!r} is not an in-flight limit (an integer >= 1)")
        parsed[cls] = limit
    return parsed


class ClassLimits:
    def __init__(self, limits: Mapping[Priority | str | int, int] | None = None) -> None:
        self.limits = parse_class_limits(limits)
        self.running: Counter[Priority] = Counter()
        self._waiting: dict[Priority, deque[asyncio.Future]] = {cls: deque() for cls in Priority}

    def waiting(self, cls: Priority) -> int:
        return sum(not f.done() for f in self._waiting[cls])

    async def enter(self, cls: Priority) -> None:
        """Returns once a request of ``cls`` may run (at once when under the limit and no one waits)."""
        limit = self.limits.get(cls)
        queue = self._waiting[cls]
        if limit is None or (self.running[cls] < limit and not queue):
            self.running[cls] += 1
            return
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn  # leave() hands over the finished request's slot: ``running`` already counts us
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave(cls)  # the slot came just as we were cancelled: the next in line takes it
            elif turn in queue:
                queue.remove(turn)
            raise

    def leave(self, cls: Priority) -> None:
        """A request of ``cls`` that entered finished: the first still waiting takes its slot."""
        queue = self._waiting[cls]
        while queue:
            turn = queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.running[cls] -= 1

    def stats(self) -> dict[str, dict[str, int]]:
        """Per class: running, waiting, and its limit (0: none)."""
        return {
            cls.label: {"running": self.running[cls], "waiting": self.waiting(cls), "limit": self.limits.get(cls, 0)}
            for cls in Priority
        }
