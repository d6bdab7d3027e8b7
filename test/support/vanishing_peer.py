"""A gateway peer in a process of its own that asks for a long answer, prints its pc_id once audio flows,
then waits to be killed: no goodbye on the wire, so the gateway sees only unanswered ICE consent checks.
Run it as ``python -c VANISHING_PEER URL``."""

from __future__ import annotations

VANISHING_PEER = """
import asyncio, sys
from aiohttp import ClientSession
from mstar_ros.webrtc.client import GatewayClient
from mstar_ros.webrtc.server import configure_ice

async def main():
    configure_ice("127.0.0.1", 1.5)  # as the gateway's own process does: loopback candidates
    client = GatewayClient(keep_samples=False)
    async with ClientSession() as http:
        answer = await client.connect(http, sys.argv[1])
    client.send(type="response.create", text="A long answer that nobody will hear to its end. " * 6)
    await client.until(lambda: client.loud_frames() > 5, 60, "audio")
    print(answer["pc_id"], flush=True)
    await asyncio.sleep(600)  # killed here: no DTLS close, no SCTP shutdown, nothing more on the wire

asyncio.run(main())
"""
