"""The gateway's base URL as a client writes it (an IPv6 host in brackets)."""

from __future__ import annotations


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
