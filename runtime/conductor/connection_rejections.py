"""Why the Conductor refused a control connection, counted per kind, logged throttled.

Anyone who can reach the control address can open connections that never prove the pool
token: 300 of them must not become 300 WARNING lines (nor lines that do not say why). The
first rejection of a kind is logged at once with its reason; repeats within ``period_s``
are counted and said in one line with the count (``mstar.counted_log``), also when they
stop coming: a pending count is flushed once its period has run out.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from mstar.counted_log import REPORT_PERIOD_S, CountedLog
from mstar.worker.protocol import FrameTooLarge


class RejectedConnection(Exception):
    """A control connection that is not (or not yet) a Worker of this pool. ``kind`` groups repeats
    ("silent", "closed", "oversized", "garbled", "unproven", "rank", "setup"); ``reason`` says why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def rejection_for(exc: BaseException, waiting_for: str, timeout_s: float) -> RejectedConnection:
    """What a failed read of the peer's ``waiting_for`` (its Hello, its Ready) means, in words."""
    if isinstance(exc, asyncio.TimeoutError):
        return RejectedConnection("silent", f"it sent no {waiting_for} within {timeout_s:g}s")
    if isinstance(exc, (asyncio.IncompleteReadError, ConnectionError)):
        return RejectedConnection("closed", f"it closed the connection before its {waiting_for} was complete")
    if isinstance(exc, FrameTooLarge):
        return RejectedConnection("oversized", f"its {waiting_for}: {exc}")
    if isinstance(exc, msgspec.DecodeError):
        return RejectedConnection("garbled", f"its {waiting_for} is not a control message ({exc})")
    return RejectedConnection("garbled", f"its {waiting_for} failed: {type(exc).__name__}: {exc}")


class ConnectionRejections:
    """Counts (``counts``: kind -> connections) and logs, throttled, the control connections refused."""

    def __init__(self, log: logging.Logger, period_s: float = REPORT_PERIOD_S) -> None:
        self._log = CountedLog(log, period_s=period_s, clock=lambda: asyncio.get_running_loop().time())
        self.counts = self._log.counts
        self._flush_timer: asyncio.TimerHandle | None = None

    def note(self, peer: object, rejected: RejectedConnection) -> None:
        self._log.note(rejected.kind, f"rejected a worker connection from {peer}: {rejected.reason}")
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        due = self._log.next_flush_at()
        if due is not None and self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_at(due, self._flush)

    def _flush(self) -> None:
        self._flush_timer = None
        self._log.flush()
        self._schedule_flush()  # a kind whose period has not run out yet

    def close(self) -> None:
        """Says what is still counted but unsaid (the pool is stopping), and stops the flush timer."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._log.flush(force=True)
