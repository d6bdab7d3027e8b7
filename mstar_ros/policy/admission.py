"""At most ``limit`` action chunks in flight across the robots of one node set.

On a device that one robot's forward already keeps busy, batching more robots buys
throughput with latency: every chunk of a batch waits for the whole batch (8 robots on
the bench preset, 2 CPU cores: 4.6 chunks/s at ~1.7 s each, against 4.1 chunks/s at
~0.53 s with 2 in flight). A robot takes its observation only once admitted, so the
limit bounds sensor-to-action latency, not just queueing. Robots are admitted in the
order their requests fell due; a finished chunk hands its slot to the longest-waiting
robot at once rather than at that robot's next control tick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class ChunkAdmission:
    def __init__(self, limit: int = 0) -> None:
        """``limit`` chunks in flight at most; 0: no limit."""
        if limit < 0:
            raise ValueError(f"max in-flight chunks must be >= 0 (0: no limit), got {limit}")
        self.limit = limit
        self.in_flight = 0
        self.peak_in_flight = 0  # the most chunks that were in flight together
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[float, Callable[[], None]]] = {}  # robot -> (due since, retry)

    def try_acquire(self, robot: str, due_since: float, retry: Callable[[], None]) -> bool:
        """Admits ``robot`` (due since ``due_since``) if a slot is free and no robot that fell
        due earlier is waiting; otherwise it waits and ``retry`` is called when a slot frees."""
        with self._lock:
            if self.limit:
                self._waiting[robot] = (due_since, retry)
                ahead = sum(due < due_since for due, _ in self._waiting.values())  # robots due longer
                if self.in_flight + ahead >= self.limit:
                    return False
                del self._waiting[robot]
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            return True

    def release(self) -> None:
        """A chunk came back (or its request failed, or its robot gave the slot up)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
        self._wake_next()

    def withdraw(self, robot: str) -> None:
        """``robot`` no longer waits (its sensors went quiet): it must not hold the others back."""
        with self._lock:
            self._waiting.pop(robot, None)
        self._wake_next()

    def _wake_next(self) -> None:
        # Called with no lock held: a retry runs another robot's control step. Every robot that
        # a free slot is for is woken (a woken one only leaves the queue when it retries).
        with self._lock:
            free = self.limit - self.in_flight if self.limit else 0
            first = sorted(self._waiting.values(), key=lambda w: w[0])[: max(0, free)]
        for _, retry in first:
            retry()
