"""The Conductor <-> Worker handshake over real sockets: each side proves the pool token, neither sends it.

The Conductor side is a real WorkerPool listening on 127.0.0.1 (no Worker launched: the
test speaks for the Worker); the Worker side is a real Worker process facing a Conductor
impostor played by the test.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from mstar.conductor.worker_pool import WorkerPool
from mstar.worker import handshake
from mstar.worker.protocol import TOKEN_ENV, Challenge, Hello, ModelSpec, Setup, encode_frame
from mstar.worker.registry import MODELS
from support.conductor_helpers import config, run
from support.pool_peer import OTHER, TOKEN, closed_without_a_reply, impostor_conductor, read_frame, with_pool


def test_a_hello_with_a_wrong_proof_is_refused_and_a_right_one_gets_the_conductors_proof_and_setup(
    tmp_path, monkeypatch
):
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


def test_a_worker_builds_nothing_for_a_conductor_that_cannot_prove_the_token(tmp_path):
    marker = tmp_path / "built"
    (tmp_path / "marking_factory.py").write_text(
        "import pathlib\n"
        f"def build(nodes, **kw):\n    pathlib.Path({str(marker)!r}).write_text('built')\n    raise RuntimeError('x')\n"
    )
    setup = Setup(spec=ModelSpec("marking"), nodes=["sum"], config=config())
    env = {
        **os.environ,
        TOKEN_ENV: TOKEN,
        MODELS.env: "marking=marking_factory:build",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)]),
    }
    for proof, want_rc in ((b"x" * 32, 2), (None, 1)):  # a made-up proof, then the real one (builds, then fails)
        port, thread, got = impostor_conductor(proof, encode_frame(setup))
        worker = subprocess.run(
            [sys.executable, "-m", "mstar.worker.process_main", "--conductor", f"127.0.0.1:{port}", "--rank", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        thread.join(10)
        assert worker.returncode == want_rc, worker.stderr
        assert TOKEN.encode() not in got["bytes"]  # the token itself never crossed the wire
        if proof is not None:
            assert worker.stderr.strip() == (
                f"mstar worker rank 1: error: the Conductor at 127.0.0.1:{port} could not "
                f"prove it holds the pool token: building nothing it asks for"
            )
            assert not marker.exists(), "the Worker built a model for an unproven Conductor"
    assert marker.exists()  # the same Setup with a valid proof is built: the refusal above was the proof's


@pytest.mark.parametrize("tamper", ["nonce", "proof"])
def test_proofs_fail_when_anything_changes(tamper):
    challenge = handshake.challenge()
    hello = handshake.hello(TOKEN, challenge, 3, 42, "h")
    assert handshake.hello_is_valid(TOKEN, challenge, hello)
    assert not handshake.hello_is_valid(OTHER, challenge, hello)
    assert not handshake.hello_is_valid(TOKEN, handshake.challenge(), hello)  # another connection's challenge
    bad = (
        Hello(3, 42, "h", os.urandom(16), hello.proof)
        if tamper == "nonce"
        else Hello(3, 42, "h", hello.nonce, bytes(32))
    )
    assert not handshake.hello_is_valid(TOKEN, challenge, bad)
    welcome = handshake.welcome(TOKEN, challenge, hello)
    assert handshake.welcome_is_valid(TOKEN, challenge, hello, welcome)
    assert not handshake.welcome_is_valid(TOKEN, challenge, handshake.hello(TOKEN, challenge, 3, 42, "h"), welcome)
    assert welcome.proof != hello.proof
