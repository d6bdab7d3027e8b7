"""Tests that speak for a Worker to a real WorkerPool, or for a Conductor to a real Worker process.

``with_pool`` runs a WorkerPool on 127.0.0.1 that launches nothing (the test connects in
the Worker's place); ``impostor_conductor`` listens once, plays the Conductor's side of the
handshake with the pool token and then sends what the test gives it.
"""

from __future__ import annotations

import asyncio
import socket
import threading

from mstar.conductor.worker_pool import WorkerPool
from mstar.placement import load_placement
from mstar.worker import handshake
from mstar.worker.protocol import HEADER_SIZE, TOKEN_ENV, Welcome, decode_body, encode_frame, frame_length
from support.conductor_helpers import config
from support.toy_factory import toy_spec, toy_streaming

TOKEN, OTHER = "pool-token-0123456789abcdef", "another-pool-token-abcdef"
PLACEMENT = "world_size: 2\nnode_groups:\n  - {nodes: [llm], ranks: [0]}\n  - {nodes: [sum], ranks: [1]}\n"


async def read_frame(reader: asyncio.StreamReader):
    return decode_body(await reader.readexactly(frame_length(await reader.readexactly(HEADER_SIZE))))


async def with_pool(tmp_path, monkeypatch, body, **options):
    """Runs ``body(pool)`` while a pool waits for Workers that the test plays itself."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    path = tmp_path / "placement.yaml"
    path.write_text(PLACEMENT)
    graph, _ = toy_streaming(set())
    pool = WorkerPool(toy_spec(), load_placement(str(path), graph), config(), launch=False, **options)
    await pool.listen()
    try:
        return await body(pool)
    finally:
        await pool.stop()


async def closed_without_a_reply(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except ConnectionResetError:
        return True


def impostor_conductor(welcome_proof: bytes | None, then: bytes, hold_s: float = 0.0):
    """Listens once; returns (port, thread, got): sends a Challenge, takes the Hello, answers a Welcome
    with ``welcome_proof`` (None: a valid one) followed by the bytes ``then``, keeps the connection
    ``hold_s`` seconds (or until the Worker closes it) and records every byte the Worker sent in got["bytes"]."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: dict = {"bytes": b""}

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(30)
        challenge = handshake.challenge()
        conn.sendall(encode_frame(challenge))
        data = b""
        while len(data) < HEADER_SIZE or len(data) < HEADER_SIZE + frame_length(data[:HEADER_SIZE]):
            data += conn.recv(65536)
        hello = decode_body(data[HEADER_SIZE:])
        got["hello"] = hello
        proof = handshake.welcome(TOKEN, challenge, hello).proof if welcome_proof is None else welcome_proof
        conn.sendall(encode_frame(Welcome(proof)) + then)
        conn.settimeout(hold_s or 30)
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except OSError:
            pass
        got["bytes"] = data
        conn.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, got
