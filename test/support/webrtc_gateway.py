"""A voice gateway served on a free loopback port, for the WebRTC tests."""
from __future__ import annotations

from aiohttp import web


async def serve_gateway(gateway) -> tuple[web.AppRunner, str]:
    """The gateway's app on 127.0.0.1:<free port>: (runner to clean up, base URL)."""
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
