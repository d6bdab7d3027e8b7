"""A sensor topic flooding bad messages is shut for a while, so that it costs nothing meanwhile.

Rejecting a bad message is cheap, receiving it is not: rclpy's executor spends ~0.5-1.5 ms of
CPU (and of the GIL, which the model's thread needs between its torch ops) on every message it
takes, whatever the message holds. 400 bad frames a second on one robot's camera doubled
another robot's sensor-to-action latency (bench pi05 --flood). A topic that sends more than
``max_bad_per_s`` bad messages a second (counted over the last ``window_s``, a quarter of a
second: a flood is cut after ~25 messages) is therefore unsubscribed (its publisher's data
then goes nowhere) for ``first_hold_s``, then listened to again; a flood that is still going
shuts it again at once, for twice as long (up to ``max_hold_s``); after ``max_hold_s`` without
a trip the hold starts over. A camera that is merely misconfigured (all its frames the wrong
size at 30 Hz) stays under the rate and is reported, not shut. Times are passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Topic:
    bad: deque = field(default_factory=deque)  # times of the bad messages within the last window
    hold_s: float = 0.0  # the next hold (0: the first)
    shut_until: float | None = None  # shut (and until when), None while listened to
    reopened_at: float = float("-inf")  # when it was last listened to again after a hold


class FloodGuard:
    def __init__(
        self, max_bad_per_s: float, first_hold_s: float = 5.0, max_hold_s: float = 60.0, window_s: float = 0.25
    ) -> None:
        if max_bad_per_s < 0 or not 0 < first_hold_s <= max_hold_s or not window_s > 0:
            raise ValueError(
                f"need max_bad_per_s >= 0, 0 < first_hold_s <= max_hold_s and window_s > 0, got "
                f"{max_bad_per_s}, {first_hold_s}, {max_hold_s}, {window_s}"
            )
        self.max_bad_per_s, self.first_hold_s, self.max_hold_s = max_bad_per_s, first_hold_s, max_hold_s
        self.window_s = window_s
        self._topics: dict[str, _Topic] = {}

    def bad(self, topic: str, now: float) -> float | None:
        """Counts a bad message; the hold in seconds when it trips the topic (the caller unsubscribes)."""
        if not self.max_bad_per_s:
            return None
        t = self._topics.setdefault(topic, _Topic())
        if t.shut_until is not None:
            return None  # already shut (a message that was in flight)
        t.bad.append(now)
        while t.bad and now - t.bad[0] > self.window_s:
            t.bad.popleft()
        if len(t.bad) <= self.max_bad_per_s * self.window_s:
            return None
        if now - t.reopened_at > self.max_hold_s:
            t.hold_s = self.first_hold_s  # calm for long enough since it was reopened: start over
        else:
            t.hold_s = min(self.max_hold_s, max(self.first_hold_s, 2 * t.hold_s))
        t.shut_until = now + t.hold_s
        t.bad.clear()
        return t.hold_s

    def reopened(self, topic: str, now: float) -> None:
        """The caller listens to ``topic`` again (its hold is over): its bad messages count again."""
        t = self._topics.get(topic)
        if t is not None:
            t.shut_until, t.reopened_at = None, now

    def is_shut(self, topic: str) -> bool:
        t = self._topics.get(topic)
        return t is not None and t.shut_until is not None
