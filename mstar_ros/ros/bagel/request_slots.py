"""How many of a BAGEL node's requests of each kind (questions, edits) it holds at once; no ROS here.

A request is taken on arrival (the ROS executor's thread) and given back when it is done on the asyncio loop.
A kind at its limit refuses the next request before anything of it is made -- no pixel converted, nothing
queued on the loop -- so a flood holds at most ``limit`` requests (and their frames) per kind, whatever its
rate. Each kind has its own slots: a flood of edits (a flow loop each, slow) never takes the slots
questions are answered in, nor the reverse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class RequestSlots:
    def __init__(self, limit: int, kinds: Iterable[str] = ("ask", "edit")) -> None:
        if limit < 1:
            raise ValueError(f"a kind needs at least one slot, got limit {limit}")
        self.limit = limit
        self._taken = dict.fromkeys(kinds, 0)
        self._lock = threading.Lock()

    def take(self, kind: str) -> bool:
        """Takes a slot of ``kind``; False (nothing taken) when all its slots are taken."""
        with self._lock:
            if self._taken[kind] >= self.limit:
                return False
            self._taken[kind] += 1
            return True

    def give_back(self, kind: str) -> None:
        with self._lock:
            if self._taken[kind] <= 0:
                raise RuntimeError(f"a {kind!r} slot given back that was not taken")
            self._taken[kind] -= 1

    def taken(self, kind: str) -> int:
        with self._lock:
            return self._taken[kind]
