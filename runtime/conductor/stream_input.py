"""A graph input whose values arrive over time: the far end of a streaming edge cut at a partition.

When a graph is split at a partition boundary (mstar.graph.split), the consumer
partition's graph gets ``StreamingGraphEdge("input.<name>", ...)``. A request to it
passes a :class:`StreamInput` for ``<name>``; whoever receives the producer's items
(a ROS subscription, a socket) ``put``s them as they come and ``close``s it at the
end. The chunk policy of the cut connection applies to them exactly as it would
inside one graph, so the consumer computes what the unsplit graph computes.

``put``/``close``/``fail`` may be called from any thread.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator

import torch

_END = object()


class StreamInputError(RuntimeError):
    """The producer side of a stream failed (a gap, bad data): the request fails with this."""


class StreamInput:
    def __init__(self) -> None:
        self._items: list[object] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self.closed = False
        self.count = 0

    def put(self, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"StreamInput.put takes a tensor, got {type(tensor).__name__}")
        self._push(tensor)

    def close(self) -> None:
        self._push(_END)

    def fail(self, message: str) -> None:
        self._push(StreamInputError(message))

    def _push(self, item: object) -> None:
        with self._lock:
            if self.closed:
                raise RuntimeError("StreamInput is closed: no more items")
            if item is _END or isinstance(item, StreamInputError):
                self.closed = True
            else:
                self.count += 1
            self._items.append(item)
            loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            loop.call_soon_threadsafe(wakeup.set)

    async def items(self) -> AsyncIterator[torch.Tensor]:
        """Yields the tensors in order; returns at close; raises StreamInputError on fail."""
        with self._lock:
            self._loop, self._wakeup = asyncio.get_running_loop(), asyncio.Event()
        while True:
            with self._lock:
                pending, self._items = self._items, []  # consumed items are not kept
                if not pending:
                    self._wakeup.clear()
            if not pending:
                await self._wakeup.wait()
                continue
            for item in pending:
                if item is _END:
                    return
                if isinstance(item, StreamInputError):
                    raise item
                yield item  # type: ignore[misc]
