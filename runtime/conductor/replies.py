"""Hands NodeOutputs from worker threads to the event loop: one wake-up per burst, not per token."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable

from mstar.engine.device_loop import device_thread
from mstar.engine.messages import NodeOutput

log = logging.getLogger("mstar.conductor")
Deliver = Callable[[NodeOutput], None]


class ReplyInbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[Deliver, NodeOutput]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def push(self, deliver: Deliver, out: NodeOutput) -> None:
        """Thread-safe. A decode step of B sequences wakes the loop once, not B times;
        ``deliver(out)`` then runs on the event loop."""
        with self._lock:
            self._items.append((deliver, out))
            if self._scheduled:
                return
            self._scheduled = True
        device_thread().after_step(self._wake)  # from an engine step: once, when the step ends

    def _wake(self) -> None:
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        for deliver, out in items:
            try:
                deliver(out)
            except Exception:  # one request's bug must not drop the others' outputs
                log.exception("delivering an output failed")
