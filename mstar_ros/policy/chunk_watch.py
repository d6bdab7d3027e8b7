"""Can the policy produce chunks? A Worker down, a chunk overdue or failed is a policy outage.

A robot whose policy cannot give it chunks must hold and say so, as on a sensor loss. The
node asks this each control tick with what it sees: the first Worker that is down (its own
words, from the Conductor's status), and when the chunk in flight was requested. A chunk
requested more than ``timeout_s`` ago is overdue; by default that is one chunk's duration
(horizon / rate): by then every action of it would lie in the past. A failed chunk starts
an outage as well. The outage lasts until a chunk is published again. Times are passed in
(monotonic seconds), so this is testable without ROS or a runtime.
"""

from __future__ import annotations


class ChunkWatch:
    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.since: float | None = None  # in an outage since (monotonic), until a chunk is published
        self.why = ""  # what the outage is (the latest reason)

    def problem(self, now: float, worker_down: str | None, requested_at: float | None) -> str | None:
        """Why no chunk can come now: a Worker down, or the chunk in flight overdue; None when neither."""
        if worker_down is not None:
            return f"no policy: {worker_down}"
        if requested_at is not None and now - requested_at > self.timeout_s:
            return f"chunk overdue: requested {now - requested_at:.1f} s ago (chunk_timeout_s={self.timeout_s:g})"
        return None

    def begin(self, now: float, why: str) -> bool:
        """An outage (``why``): True when it starts now (the caller holds the robot), False when one
        is already under way (its reason is updated)."""
        self.why = why
        if self.since is not None:
            return False
        self.since = now
        return True

    def end(self, now: float) -> float | None:
        """A chunk was published: how long the outage lasted, or None when there was none."""
        if self.since is None:
            return None
        lasted, self.since = now - self.since, None
        return lasted

    @property
    def active(self) -> bool:
        return self.since is not None
