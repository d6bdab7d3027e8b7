"""The Conductor <-> Worker handshake over real sockets: each side proves the pool token, neither sends it.

The Conductor side is a real WorkerPool listening on 127.0.0.1 (no Worker launched: the
test speaks for the Worker); the Worker side is a real Worker process facing a Conductor
impostor played by the test.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from mstar.conductor.worker_pool import WorkerPool
from mstar.placement import load_placement
from mstar.worker import handshake
from mstar.worker.protocol import (HEADER_SIZE, TOKEN_ENV, Challenge, Hello, ModelSpec, Setup, Welcome, decode_body,
                                   encode_frame, frame_length)
from mstar.worker.registry import MODELS
from support.conductor_helpers import config, run
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
    starting = asyncio.ensure_future(pool.start())
    while pool.port == 0:
        await asyncio.sleep(0.01)
    try:
        return await body(pool)
    finally:
        starting.cancel()
        await pool.stop()


async def closed_without_a_reply(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except ConnectionResetError:
        return True


def test_a_hello_with_a_wrong_proof_is_refused_and_a_right_one_gets_the_conductors_proof_and_setup(tmp_path, monkeypatch):
    async def body(pool: WorkerPool):
        results = {}
        for case in ("other token", "proof replayed for another rank", "right"):
            reader, writer = await asyncio.open_connection(pool.host, pool.port)
            challenge = await read_frame(reader)
            assert isinstance(challenge, Challenge)
            token = OTHER if case == "other token" else TOKEN
            hello = handshake.hello(token, challenge, 1, os.getpid(), "testhost")
            if case == "proof replayed for another rank":
                hello = Hello(0, hello.pid, hello.host, hello.nonce, hello.proof)  # the proof binds the rank
            writer.write(encode_frame(hello))
            if case == "right":
                welcome, setup = await read_frame(reader), await read_frame(reader)
                results[case] = (handshake.welcome_is_valid(TOKEN, challenge, hello, welcome), setup)
            else:
                results[case] = await closed_without_a_reply(reader, 5.0)
            writer.close()
        return results

    results = run(with_pool(tmp_path, monkeypatch, body))
    assert results["other token"] is True
    assert results["proof replayed for another rank"] is True
    valid, setup = results["right"]
    assert valid and isinstance(setup, Setup) and setup.nodes == ["sum"] and setup.spec.model == "toy_streaming"


def test_a_silent_connection_is_closed_after_the_hello_timeout(tmp_path, monkeypatch):
    async def body(pool: WorkerPool):
        reader, writer = await asyncio.open_connection(pool.host, pool.port)
        assert isinstance(await read_frame(reader), Challenge)
        start = time.monotonic()
        closed = await closed_without_a_reply(reader, 5.0)
        writer.close()
        return closed, time.monotonic() - start

    closed, after = run(with_pool(tmp_path, monkeypatch, body, hello_timeout_s=0.5))
    assert closed and 0.3 < after < 3.0, after


def test_a_hello_frame_over_the_pre_auth_limit_is_refused_unread(tmp_path, monkeypatch):
    async def body(pool: WorkerPool):
        reader, writer = await asyncio.open_connection(pool.host, pool.port)
        await read_frame(reader)
        writer.write((1 << 30).to_bytes(4, "big"))  # announces a 1 GiB Hello
        closed = await closed_without_a_reply(reader, 5.0)
        writer.close()
        return closed

    assert run(with_pool(tmp_path, monkeypatch, body)) is True


def impostor_conductor(welcome_proof: bytes | None, setup: Setup):
    """Listens once; returns (port, thread result holder): sends a Challenge, takes the Hello,
    answers a Welcome with ``welcome_proof`` (None: a valid one) and the Setup."""
    import threading

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
        proof = handshake.welcome(TOKEN, challenge, hello).proof if welcome_proof is None else welcome_proof
        conn.sendall(encode_frame(Welcome(proof)) + encode_frame(setup))
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


def test_a_worker_builds_nothing_for_a_conductor_that_cannot_prove_the_token(tmp_path):
    marker = tmp_path / "built"
    (tmp_path / "marking_factory.py").write_text(
        "import pathlib\n"
        f"def build(nodes, **kw):\n    pathlib.Path({str(marker)!r}).write_text('built')\n    raise RuntimeError('x')\n")
    setup = Setup(spec=ModelSpec("marking"), nodes=["sum"], config=config())
    env = {**os.environ, TOKEN_ENV: TOKEN, MODELS.env: "marking=marking_factory:build",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)])}
    for proof, want_rc in ((b"x" * 32, 2), (None, 1)):  # a made-up proof, then the real one (builds, then fails)
        port, thread, got = impostor_conductor(proof, setup)
        worker = subprocess.run([sys.executable, "-m", "mstar.worker.process_main", "--conductor", f"127.0.0.1:{port}",
                                 "--rank", "1"], env=env, capture_output=True, text=True, timeout=60)
        thread.join(10)
        assert worker.returncode == want_rc, worker.stderr
        assert TOKEN.encode() not in got["bytes"]  # the token itself never crossed the wire
        if proof is not None:
            assert worker.stderr.strip() == (f"mstar worker rank 1: error: the Conductor at 127.0.0.1:{port} could not "
                                             f"prove it holds the pool token: building nothing it asks for")
            assert not marker.exists(), "the Worker built a model for an unproven Conductor"
    assert marker.exists()  # the same Setup with a valid proof is built: the refusal above was the proof's


@pytest.mark.parametrize("tamper", ["nonce", "proof"])
def test_proofs_fail_when_anything_changes(tamper):
    challenge = handshake.challenge()
    hello = handshake.hello(TOKEN, challenge, 3, 42, "h")
    assert handshake.hello_is_valid(TOKEN, challenge, hello)
    assert not handshake.hello_is_valid(OTHER, challenge, hello)
    assert not handshake.hello_is_valid(TOKEN, handshake.challenge(), hello)  # another connection's challenge
    bad = Hello(3, 42, "h", os.urandom(16), hello.proof) if tamper == "nonce" else Hello(3, 42, "h", hello.nonce, bytes(32))
    assert not handshake.hello_is_valid(TOKEN, challenge, bad)
    welcome = handshake.welcome(TOKEN, challenge, hello)
    assert handshake.welcome_is_valid(TOKEN, challenge, hello, welcome)
    assert not handshake.welcome_is_valid(TOKEN, challenge, handshake.hello(TOKEN, challenge, 3, 42, "h"), welcome)
    assert welcome.proof != hello.proof
