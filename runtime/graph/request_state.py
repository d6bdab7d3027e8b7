"""A request's state while its Walks run: edge values, counters, streams, what next_walk reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mstar.graph.chunk_policies import ChunkPolicy
from mstar.graph.edges import StreamingGraphEdge
from mstar.request import Request, RequestStream
from mstar.transport.handle import TensorHandle, TensorRef


@dataclass
class StreamState:
    """Items produced on one streaming edge, and how far the chunk policy has consumed them."""

    edge: StreamingGraphEdge
    policy: ChunkPolicy
    items: list[TensorHandle] = field(default_factory=list)
    cursor: int = 0
    closed: bool = False
    last_delivery: asyncio.Future | None = None  # chunks deliver their outputs in order
    tasks: set[asyncio.Task] = field(default_factory=set)  # its chunks still running
    # into a fed input (a running Loop's port): items wait in ``fed`` until the call is sent, then
    # ``sink(items, final)`` passes them on; ``feed_open``: the call was sent with the port open
    fed: list[TensorHandle] = field(default_factory=list)
    sink: Callable[[list[TensorHandle], bool], None] | None = None
    feed_open: bool = False


@dataclass
class RequestState:
    request: Request
    seed: int
    stream: RequestStream
    fetch: Callable[[TensorHandle], torch.Tensor]
    wire_id: str = ""  # this submission's id on the wire and in the store (a reused request id never collides)
    failure: BaseException | None = None  # a streamed chunk failed: the request fails with it
    main_task: asyncio.Task | None = None
    walks_done: list[str] = field(default_factory=list)
    current_walk: str | None = None
    values: dict[tuple[str, str], TensorRef] = field(default_factory=dict)  # latest value at each node input
    produced: dict[str, TensorHandle] = field(default_factory=dict)  # latest value at each "node.port"
    call_counts: dict[str, int] = field(default_factory=dict)
    output_counts: dict[str, int] = field(default_factory=dict)
    streams: dict[str, StreamState] = field(default_factory=dict)
    chunk_tasks: set[asyncio.Task] = field(default_factory=set)
    input_feeds: dict[str, asyncio.Task] = field(default_factory=dict)  # streamed input -> the task feeding it
    user: dict[str, Any] = field(default_factory=dict)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def last_walk(self) -> str | None:
        return self.walks_done[-1] if self.walks_done else None

    def value(self, endpoint: str) -> torch.Tensor | None:
        """The latest tensor produced at ``"node.port"`` (for next_walk and stop predicates)."""
        handle = self.produced.get(endpoint)
        return None if handle is None else self.fetch(handle)

    def next_index(self, node: str) -> int:
        index = self.call_counts.get(node, 0)
        self.call_counts[node] = index + 1
        return index
