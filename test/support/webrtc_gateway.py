"""A voice gateway served on a free loopback port, for the WebRTC tests."""
from __future__ import annotations

from mstar_ros.webrtc.server import serve_on_free_port as serve_gateway

__all__ = ["serve_gateway"]
