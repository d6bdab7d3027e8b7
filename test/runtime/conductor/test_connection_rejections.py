"""Control connections that are not Workers: refused with a reason, counted per kind, logged throttled.

A real WorkerPool on 127.0.0.1 (no Worker launched); the test opens the connections.
"""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from mstar.conductor.connection_rejections import REPORT_PERIOD_S
from mstar.conductor.worker_pool import WorkerPool
from mstar.worker import handshake
from mstar.worker.protocol import Challenge, Setup, Welcome, encode_frame
from support.conductor_helpers import run, until
from support.pool_peer import TOKEN, closed_without_a_reply, read_frame, with_pool

LOGGER = "mstar.conductor.workers"


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_silent_connections_make_two_lines_that_say_why_and_count_them_all(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def silent(pool: WorkerPool) -> None:
        reader, writer = await asyncio.open_connection(pool.host, pool.port)
        assert isinstance(await read_frame(reader), Challenge)
        assert await closed_without_a_reply(reader, 10.0)
        writer.close()

    async def body(pool: WorkerPool) -> WorkerPool:
        await asyncio.gather(*(silent(pool) for _ in range(40)))
        await asyncio.sleep(REPORT_PERIOD_S)  # the count of the repeats comes out when the period ends
        return pool

    pool = run(with_pool(tmp_path, monkeypatch, body, hello_timeout_s=0.3))
    lines = warnings(caplog)
    assert len(lines) == 2, lines  # was 40, each ending in an empty reason
    assert lines[0].endswith("it sent no Hello within 0.3s"), lines
    assert lines[1].endswith(f"it sent no Hello within 0.3s (38 more like this in the last {REPORT_PERIOD_S:.1f} s)")
    assert pool.rejections.counts == {"silent": 40}


def test_each_kind_of_bad_peer_gets_its_reason_and_a_worker_is_still_served(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    async def peer(pool: WorkerPool, send: bytes) -> None:
        reader, writer = await asyncio.open_connection(pool.host, pool.port)
        await read_frame(reader)
        writer.write(send)
        if send == b"\x00\x00":
            writer.write_eof()  # half a header, then gone
        assert await closed_without_a_reply(reader, 10.0)
        writer.close()

    async def body(pool: WorkerPool):
        await peer(pool, (1 << 20).to_bytes(4, "big"))  # a Hello announced over the pre-proof limit
        await peer(pool, (5).to_bytes(4, "big") + b"\xc1" * 5)  # not msgpack
        await peer(pool, b"\x00\x00")
        await peer(pool, encode_frame(Welcome(b"x" * 32)))  # a control message, but no Hello
        reader, writer = await asyncio.open_connection(pool.host, pool.port)
        challenge = await read_frame(reader)
        writer.write(encode_frame(handshake.hello(TOKEN, challenge, 1, os.getpid(), "testhost")))
        served = isinstance(await read_frame(reader), Welcome) and isinstance(await read_frame(reader), Setup)
        writer.close()  # in setup: a rejection too
        await until(lambda: len(warnings(caplog)) == 5, what="five rejections")
        return served, pool

    served, pool = run(with_pool(tmp_path, monkeypatch, body, hello_timeout_s=5.0))
    assert served
    reasons = [line.split(": ", 1)[1] for line in warnings(caplog)]
    assert reasons == [
        f"its Hello: a control frame of {1 << 20} bytes was announced, over the {64 << 10}-byte limit",
        reasons[1],
        "it closed the connection before its Hello was complete",
        "not a worker of this conductor (a Welcome without a valid proof of the pool token)",
        f"it closed the connection before its Ready (rank 1, pid {os.getpid()}) was complete",  # the test's Worker
    ]
    assert reasons[1].startswith("its Hello is not a control message (MessagePack data is malformed"), reasons[1]
    assert pool.rejections.counts == {"oversized": 1, "garbled": 1, "closed": 1, "unproven": 1, "setup": 1}
