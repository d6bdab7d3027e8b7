"""Whether a request that is due should wait for the next camera frame.

A robot acts on an observation: what the chunk plans from is as old as the observation's
oldest frame when it was taken, plus the inference time. When a request falls due late
in a frame's life (the last chunk came back just before the next frame), the next frame
is closer than the current one is old; waiting for it costs less time than it removes
from the observation's age. Past half a period that is always so, so that is the rule,
and the wait is bounded by one period so a camera that stops cannot hold the robot.
(Black et al.'s real-time chunking inpaints the actions run while a chunk is computed;
a fresher observation shortens what it must bridge.)
"""

from __future__ import annotations


def worth_waiting(age_s: float, period_s: float) -> bool:
    """True when the next frame (due in period - age) comes sooner than the newest one is old."""
    return period_s > 0 and age_s > period_s / 2


class FrameFreshness:
    """Per camera topic: the last arrival and a running estimate of the frame period."""

    def __init__(self, smoothing: float = 0.2) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self.last: dict[str, float] = {}
        self.period: dict[str, float] = {}

    def arrived(self, topic: str, at: float) -> None:
        previous = self.last.get(topic)
        if previous is not None and at > previous:
            p = self.period.get(topic)
            self.period[topic] = at - previous if p is None else p + self.smoothing * (at - previous - p)
        self.last[topic] = at

    def should_wait(self, now: float, due_since: float) -> bool:
        """Hold a request that fell due at ``due_since``: its stalest camera is past half its
        period and the request has not yet waited a whole period."""
        known = [(now - at, self.period[t]) for t, at in self.last.items() if t in self.period]
        if not known:
            return False  # periods unknown yet (first frames): act on what there is
        age, period = max(known)
        return worth_waiting(age, period) and now - due_since < period
