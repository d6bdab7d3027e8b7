"""Hands NodeOutputs from worker threads to the event loop: one wake-up per burst, not per token."""
from __future__ import annotations

import asyncio
import threading
from collections import deque

from mstar.worker.messages import NodeOutput


class ReplyInbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[asyncio.Queue, NodeOutput]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def push(self, queue: asyncio.Queue, out: NodeOutput) -> None:
        """Thread-safe. A decode step of B sequences wakes the loop once, not B times."""
        with self._lock:
            self._items.append((queue, out))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        for queue, out in items:
            queue.put_nowait(out)
