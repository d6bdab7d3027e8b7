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
from collections.abc import AsyncIterator

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


class SampleStream(StreamInput):
    """A StreamInput of 1-D samples (a microphone's), cut into items of ``item`` samples whatever sizes
    arrive; ``close`` sends the rest as a shorter last item. Past ``max_samples`` it fails: the request
    fails with a message saying so, and ``push`` raises ValueError."""

    def __init__(self, item: int, max_samples: int | None = None) -> None:
        super().__init__()
        if item < 1:
            raise ValueError(f"SampleStream item must be >= 1 samples, got {item}")
        self.item, self.max_samples = item, max_samples
        self._held = torch.zeros(0)
        self.samples = 0

    def push(self, samples) -> None:
        """Samples (a 1-D tensor or array of floats) join the stream; whole items go out now."""
        chunk = torch.as_tensor(samples, dtype=torch.float32).reshape(-1)
        if self.max_samples is not None and self.samples + chunk.numel() > self.max_samples:
            message = f"the streamed audio is over its limit of {self.max_samples} samples"
            self.fail(message)
            raise ValueError(message)
        self.samples += chunk.numel()
        held = torch.cat([self._held, chunk])
        whole = held.numel() // self.item * self.item
        for start in range(0, whole, self.item):
            self.put(held[start : start + self.item].clone())
        self._held = held[whole:]

    def close(self) -> None:
        if self._held.numel():
            self.put(self._held)
            self._held = torch.zeros(0)
        super().close()
