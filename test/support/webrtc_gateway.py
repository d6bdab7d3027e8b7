"""A voice gateway served on a free loopback port, for the WebRTC tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from mstar.conductor import Conductor
from mstar_ros.webrtc.server import VoiceGateway
from mstar_ros.webrtc.server import serve_on_free_port as serve_gateway

__all__ = ["gateway_for", "serve_gateway"]


@contextlib.asynccontextmanager
async def gateway_for(model, **gateway_kwargs) -> AsyncIterator[tuple[Conductor, VoiceGateway, str]]:
    """A Conductor for ``model`` and its gateway, served: (conductor, gateway, url); stopped at the end."""
    async with Conductor(model.graph(), model.modules()) as conductor:
        gateway = VoiceGateway(model, conductor, **gateway_kwargs)
        runner, url = await serve_gateway(gateway)
        try:
            yield conductor, gateway, url
        finally:
            await runner.cleanup()
