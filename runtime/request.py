"""What a caller submits and what it gets back."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from mstar.priority import Priority
from mstar.sampling_params import SamplingParams


@dataclass
class Request:
    """``inputs`` feed the graph's ``input.<name>`` edges; ``meta`` is read by the model's ``next_walk``.
    ``outputs`` names the graph outputs the caller wants streamed (None: all of them).
    ``priority``: its class (mstar.priority); every node call of the request carries it."""

    inputs: dict[str, torch.Tensor]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    session_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    outputs: frozenset[str] | None = None
    priority: Priority = Priority.INTERACTIVE


@dataclass
class RequestOutput:
    """One value streamed out on the graph output ``name`` (the ``index``-th on it)."""

    request_id: str
    name: str
    data: torch.Tensor
    index: int


class RequestError(RuntimeError):
    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(f"request {request_id}: {message}")
        self.request_id = request_id


class RequestCancelled(RequestError):
    pass


class UnknownRequest(KeyError):
    def __str__(self) -> str:
        return f"no request {self.args[0]!r} is in flight"


_END = object()


class RequestStream:
    """Async iterator of a request's outputs, in the order they were produced.

    Raises RequestError if the request fails and RequestCancelled if it is cancelled.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    def put(self, output: RequestOutput) -> None:
        if not self.finished:
            self._queue.put_nowait(output)

    def end(self) -> None:
        if not self.finished:
            self.finished = True
            self._queue.put_nowait(_END)

    def fail(self, error: RequestError) -> None:
        if not self.finished:
            self.finished = True
            self._queue.put_nowait(error)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        if isinstance(item, RequestError):
            self._queue.put_nowait(item)
            raise item
        return item

    async def collect(self) -> dict[str, list[torch.Tensor]]:
        out: dict[str, list[torch.Tensor]] = {}
        async for item in self:
            out.setdefault(item.name, []).append(item.data)
        return out
