"""What an HTTP connection may cost the gateway before its request is judged.

aiohttp reads a request head for as long as the client takes and keeps any number of connections,
and a chunked body (no Content-Length) is read whole before a handler can look at its size. Here:
- ``ConnectionGuard``: at most ``max_connections`` at once and ``max_connections_per_client`` from
  one address (the next is answered 503 and closed), and a connection must send a whole request head
  within ``header_timeout_s`` of opening or of its last response (408 and closed otherwise: slowloris,
  idle keep-alive; a response still being sent to a slow client keeps it open);
- ``body_middleware``: each route's body limit counted while the body is read (413 as soon as it is
  passed, Content-Length or chunked), the body read within ``body_timeout_s`` (408), and the bytes of
  bodies held at once bounded across requests (a ``SharedBudget``; 503 when it stays full): a body
  takes its share as its bytes arrive, so a client that sends slowly holds only what it sent. Handlers
  take the body with ``request_body``. (aiohttp's own ``read()`` under ``client_max_size`` appends a
  whole buffered chunk before it compares, and a refused request's buffer stayed referenced: about
  1 MB of RSS per refused chunked body, never returned.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from mstar_ros.webrtc.budget import BudgetBusy, Reservation, SharedBudget

log = logging.getLogger("mstar_ros.webrtc")

BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 256
    max_connections_per_client: int = 32  # from one address (behind a reverse proxy: raise it, or limit there)
    header_timeout_s: float = 10.0  # a whole request head, from the connection's start or its last response
    body_timeout_s: float = 60.0  # a whole body, once its head is in (16 MiB at ~2 Mbit/s)
    max_body_bytes_held: int = 64 * 2**20  # bodies being read or handled at once, all requests together


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the guard's limits."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.refused = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        limits, theirs = self.guard.limits, self.guard.by_client.get(self.client, 0)
        if self.guard.open >= limits.max_connections or theirs >= limits.max_connections_per_client:
            self.refused = True
            self.guard.refused += 1
            full = (
                f"{self.guard.open} connections are open (the limit)"
                if self.guard.open >= limits.max_connections
                else f"{self.client} has {theirs} connections open (the limit per address)"
            )
            self.guard.report(f"{full}: new ones get 503")
            transport.write(BUSY)
            transport.close()
            return
        self.guard.open += 1
        self.guard.by_client[self.client] = theirs + 1
        self.waiting_for_head()
        self.inner.connection_made(transport)

    def waiting_for_head(self) -> None:
        """From now, the next request head must be in within the timeout."""
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(self.guard.limits.header_timeout_s, self._too_slow)

    def request_started(self) -> None:
        self._cancel_timer()

    def _too_slow(self) -> None:
        if self.transport is not None and self.transport.get_write_buffer_size() > 0:
            self.waiting_for_head()  # a response still going out to a slow client: its time starts after
            return
        self.guard.timed_out += 1
        self.guard.report(
            f"a connection sent no whole request head within {self.guard.limits.header_timeout_s:g} s: closed (408)"
        )
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(TIMEOUT)
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self._cancel_timer()
        self.guard.open -= 1
        left = self.guard.by_client.get(self.client, 0) - 1
        if left > 0:
            self.guard.by_client[self.client] = left
        else:
            self.guard.by_client.pop(self.client, None)
        self.inner.connection_lost(exc)


class ConnectionGuard:
    def __init__(self, limits: ConnectionLimits, report_every_s: float = 10.0) -> None:
        self.limits = limits
        self.open = self.refused = self.timed_out = 0
        self.by_client: dict[str, int] = {}  # open connections per address
        self._report_every_s, self._last_report = report_every_s, float("-inf")
        self._quiet = 0

    def protocol_factory(self, inner_factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: GuardedConnection(self, inner_factory())

    def report(self, text: str) -> None:
        """A WARNING at most every ``report_every_s``, with how many were not logged in between."""
        now = asyncio.get_running_loop().time()
        if now - self._last_report < self._report_every_s:
            self._quiet += 1
            return
        more = f" (and {self._quiet} more like it in the last {now - self._last_report:.0f} s)" if self._quiet else ""
        self._last_report, self._quiet = now, 0
        log.warning("%s%s; %d refused, %d timed out so far", text, more, self.refused, self.timed_out)


class GuardedSite(web.TCPSite):
    """A TCP site whose connections go through a ConnectionGuard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.protocol_factory(server), self._host, self._port, backlog=self._backlog
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


def body_middleware(limit_of: Callable[[web.Request], int], limits: ConnectionLimits):
    """The middleware that reads each body under its route's limit (``limit_of``), the timeout and the
    shared budget, before the handler runs; the handler's ``read()`` / ``json()`` then take it as read."""
    budget = SharedBudget(limits.max_body_bytes_held, "bytes of request bodies")

    @web.middleware
    async def read_body(request: web.Request, handler):
        connection = request.transport.get_protocol() if request.transport is not None else None
        if isinstance(connection, GuardedConnection):
            connection.request_started()
        try:
            if not request.body_exists:
                return await handler(request)
            limit = limit_of(request)
            size = request.content_length
            if size is not None and size > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
            try:
                async with budget.reserve(0) as held:
                    try:
                        body = await asyncio.wait_for(_read_within(request, limit, held), limits.body_timeout_s)
                    except asyncio.TimeoutError:
                        raise web.HTTPRequestTimeout(
                            text=f"the body did not arrive within {limits.body_timeout_s:g} s"
                        ) from None
                    request[BODY] = body
                    return await handler(request)
            except BudgetBusy as exc:
                raise web.HTTPServiceUnavailable(text=str(exc)) from None
        finally:
            if isinstance(connection, GuardedConnection):
                connection.waiting_for_head()

    return read_body


BODY = web.RequestKey("mstar_ros.body", bytes)  # where body_middleware leaves the body on the request


async def _read_within(request: web.Request, limit: int, held: Reservation) -> bytes:
    """The body, refused (413) as soon as it passes ``limit``, with nothing of it kept; ``held`` grows with
    each piece as it arrives (the body budget)."""
    body, received = bytearray(), 0
    async for chunk in request.content.iter_any():
        received += len(chunk)
        if received > limit:
            break
        await held.grow(len(chunk))
        body.extend(chunk)
    if received > limit:
        # the exception outlives this frame (aiohttp answers with it): it must hold none of the data
        del body, chunk
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=received)
    return bytes(body)


async def request_body(request: web.Request) -> bytes:
    """The request's body: as body_middleware read it, or read here where no middleware did."""
    return request[BODY] if BODY in request else await request.read()
