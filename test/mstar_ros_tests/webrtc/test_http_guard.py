"""What a connection may cost before its request is judged: real aiohttp behind the guard, raw sockets as clients."""

from __future__ import annotations

import asyncio

from aiohttp import web

from mstar_ros.webrtc.http_guard import ConnectionGuard, ConnectionLimits, GuardedSite, body_middleware, request_body

BIG = 16 * 2**20


async def serve(limits: ConnectionLimits, body_limit: int = 1024):
    """An app whose one route echoes its body's length, behind the guard: (runner, guard, port)."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request_body(request))))

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def big(_request: web.Request) -> web.Response:
        return web.Response(body=b"x" * BIG)

    app = web.Application(client_max_size=16 * 2**20, middlewares=[body_middleware(lambda _r: body_limit, limits)])
    app.router.add_post("/echo", echo)
    app.router.add_get("/", page)
    app.router.add_get("/big", big)
    runner = web.AppRunner(app)
    await runner.setup()
    guard = ConnectionGuard(limits)
    site = GuardedSite(runner, "127.0.0.1", 0, guard)
    await site.start()
    return runner, guard, site.port


async def status_of(reader: asyncio.StreamReader) -> int:
    line = await reader.readline()
    return int(line.split()[1]) if line else 0


def test_a_chunked_body_is_refused_as_soon_as_it_passes_its_limit_not_once_read_whole():
    async def main():
        runner, _, port = await serve(ConnectionLimits(), body_limit=64 * 1024)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            answer = asyncio.ensure_future(status_of(reader))
            sent = 0
            for _ in range(15 * 16):  # 15 MiB in 64 KiB chunks, unless the answer comes first
                chunk = b"x" * 65536
                try:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
                except ConnectionError:
                    break
                sent += len(chunk)
                await asyncio.sleep(0.002)
                if answer.done():
                    break
            status = await asyncio.wait_for(answer, 10)
            writer.close()
            # a small body under the limit still goes through, chunked
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            small = await status_of(reader)
            writer.close()
            return status, sent, small
        finally:
            await runner.cleanup()

    status, sent, small = asyncio.run(main())
    assert status == 413
    assert sent < 2 * 2**20, sent  # answered within the first ~2 MiB of a 15 MiB body (the limit is 64 KiB)
    assert small == 200


def test_connections_past_the_limit_get_503_and_slow_heads_and_bodies_get_408():
    async def main():
        limits = ConnectionLimits(max_connections=3, header_timeout_s=0.5, body_timeout_s=0.5)
        runner, guard, port = await serve(limits)
        out = {}
        try:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            for _, writer in held:
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # half a head: slowloris
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            out["fourth"] = await asyncio.wait_for(status_of(reader), 5)
            writer.close()
            loop = asyncio.get_running_loop()
            started = loop.time()
            out["slow_heads"] = [await asyncio.wait_for(status_of(r), 5) for r, _ in held]
            out["closed_after_s"] = loop.time() - started
            out["eof"] = [await asyncio.wait_for(r.read(), 5) for r, _ in held]
            for _, w in held:
                w.close()
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")  # 10 of 100
            out["slow_body"] = await asyncio.wait_for(status_of(reader), 5)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            out["kept_alive"] = await asyncio.wait_for(status_of(reader), 5)
            await asyncio.wait_for(reader.readuntil(b"ok"), 5)
            started = loop.time()
            await asyncio.wait_for(reader.readuntil(b"408"), 5)  # idle after its response: closed too
            out["idle_closed_after_s"] = loop.time() - started
            writer.close()
            out["counts"] = (guard.refused, guard.timed_out)
            await asyncio.sleep(0.05)
            out["open"] = guard.open
        finally:
            await runner.cleanup()
        return out

    out = asyncio.run(main())
    assert out["fourth"] == 503
    assert out["slow_heads"] == [408, 408, 408] and out["closed_after_s"] < 2.0, out
    assert out["slow_body"] == 408
    assert out["kept_alive"] == 200 and out["idle_closed_after_s"] < 2.0
    assert out["counts"] == (1, 4) and out["open"] == 0, out


def test_slow_bodies_hold_only_what_they_sent_and_one_address_cannot_take_every_connection():
    async def main():
        limits = ConnectionLimits(
            max_connections=20, max_connections_per_client=6, header_timeout_s=0.5, max_body_bytes_held=4 * 1024
        )
        runner, guard, port = await serve(limits, body_limit=1024)
        out = {}
        try:
            # four bodies that each could take a quarter of the budget, sending one byte and stalling
            slow = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            for _, writer in slow:
                writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n")
            await asyncio.sleep(0.1)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"y" * 1000)
            out["beside_slow_bodies"] = await asyncio.wait_for(status_of(reader), 5)
            writer.close()
            # the same address: two more connections reach its limit of 6, the next gets 503
            more = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            out["seventh_same_address"] = await asyncio.wait_for(status_of(reader), 5)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            out["another_address"] = await asyncio.wait_for(status_of(reader), 5)
            writer.close()
            for _, w in slow + more:
                w.close()
            # a large response read slowly is not cut off by the head timer
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(1.5)  # three head timeouts while the response waits in the buffers
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            body = await asyncio.wait_for(reader.readexactly(BIG), 10)
            out["slow_download"] = (int(head.split()[1]), len(body))
            writer.close()
        finally:
            await runner.cleanup()
        return out

    out = asyncio.run(main())
    assert out["beside_slow_bodies"] == 200, out  # four stalled bodies hold 4 bytes, not the 4 KiB budget
    assert out["seventh_same_address"] == 503 and out["another_address"] == 200, out
    assert out["slow_download"] == (200, BIG), out
