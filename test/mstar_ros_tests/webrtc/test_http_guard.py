"""What a connection may cost before its request is judged: real aiohttp behind the guard, raw sockets as clients."""
from __future__ import annotations

import asyncio

from aiohttp import web

from mstar_ros.webrtc.http_guard import ConnectionGuard, ConnectionLimits, GuardedSite, body_middleware, request_body


async def serve(limits: ConnectionLimits, body_limit: int = 1024):
    """An app whose one route echoes its body's length, behind the guard: (runner, guard, port)."""
    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request_body(request))))

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=16 * 2**20, middlewares=[body_middleware(lambda _r: body_limit, limits)])
    app.router.add_post("/echo", echo)
    app.router.add_get("/", page)
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
