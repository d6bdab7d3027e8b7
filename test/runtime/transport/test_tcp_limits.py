"""The TCP tensor server's limits, over real sockets: lengths it reads, connections and threads it holds.

Raw sockets play the peers (authenticated with the real HMAC handshake where the case
needs it); the server runs in this process, so its threads and allocations are ours to count.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import tracemalloc

import pytest
import torch

from mstar.transport import auth
from mstar.transport.tcp import TensorClient, TensorServer
from mstar.transport.tcp_server import DEFAULT_SEND_THREADS
from mstar.transport.tcp_wire import MAX_KEY_BYTES, MAX_MESSAGE_BYTES, MISSING, OK, REFUSED, REPLY

SECRET = b"pool-token-0123456789"
BIG = 16 << 20


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    return {
        "small": torch.arange(1000, dtype=torch.float32),
        "big": torch.randint(0, 255, (BIG,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5)),
    }


@pytest.fixture
def make_server(tensors):
    made: list[TensorServer] = []

    def make(**options) -> TensorServer:
        made.append(TensorServer("127.0.0.1", tensors.get, SECRET, **options))
        return made[-1]

    yield make
    for server in made:
        server.stop()


def recv_n(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def authenticated(server: TensorServer) -> socket.socket:
    """A raw connection that has done the real handshake (and checked the server's proof)."""
    sock = socket.create_connection((server.host, server.port), timeout=10)
    server_nonce, mine = recv_n(sock, auth.NONCE_BYTES), auth.new_nonce()
    sock.sendall(mine + auth.proof(SECRET, b"client", server_nonce, mine))
    assert auth.proof_matches(recv_n(sock, auth.PROOF_BYTES), SECRET, b"server", mine, server_nonce)
    return sock


def read_all_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def fetch(server: TensorServer, key: str, nbytes: int, client: TensorClient | None = None) -> torch.Tensor:
    into = torch.empty(nbytes, dtype=torch.uint8)
    (client or TensorClient(SECRET)).fetch(server.host, server.port, key, into)
    return into


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_2gib_key_is_refused_from_its_header_alone_without_allocating(make_server, tensors):
    server = make_server()
    sock = authenticated(server)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = time.monotonic()
        sock.sendall(struct.pack("!I", 2 << 30))  # the header only: the 2 GiB never follow
        reply = read_all_until_closed(sock, timeout=5)
        took = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sock.close()
    status, length = REPLY.unpack(reply[: REPLY.size])
    assert status == REFUSED and reply[REPLY.size :].decode() == (
        f"a tensor key of {2 << 30} bytes is over the {MAX_KEY_BYTES}-byte limit"
    )
    assert took < 2.0, f"the refusal took {took:.2f}s"  # the server did not wait for the key's bytes
    assert peak < 1 << 20, f"{peak} bytes allocated while refusing"
    assert torch.equal(fetch(server, "small", 4000).view(torch.float32), tensors["small"])  # still serving


def test_keys_up_to_the_limit_are_read_and_one_byte_more_is_refused(make_server):
    server = make_server()
    sock = authenticated(server)
    sock.sendall(struct.pack("!I", MAX_KEY_BYTES) + b"k" * MAX_KEY_BYTES)
    status, length = REPLY.unpack(recv_n(sock, REPLY.size))
    assert status == MISSING and b"is not (or no longer) held" in recv_n(sock, length)
    sock.sendall(struct.pack("!I", MAX_KEY_BYTES + 1))
    status, _ = REPLY.unpack(read_all_until_closed(sock, timeout=5)[: REPLY.size])
    assert status == REFUSED
    with pytest.raises(ValueError, match=f"over the {MAX_KEY_BYTES}-byte limit of tensor servers"):
        fetch(server, "k" * (MAX_KEY_BYTES + 1), 4)  # the client does not even ask


def test_300_idle_connections_make_no_threads(make_server, tensors):
    server = make_server()
    before_py, before_os = threading.active_count(), os_threads()
    idle = [authenticated(server) for _ in range(150)]  # persistent, between requests
    silent = [socket.create_connection((server.host, server.port)) for _ in range(150)]  # mid-handshake
    try:
        deadline = time.monotonic() + 10
        while server.connections < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.connections == 300
        assert (threading.active_count(), os_threads()) == (before_py, before_os)
        for sock in idle[:3]:  # each idle connection still serves when asked
            sock.sendall(struct.pack("!I", 5) + b"small")
            status, length = REPLY.unpack(recv_n(sock, REPLY.size))
            assert status == OK and recv_n(sock, length) == tensors["small"].numpy().tobytes()
        assert torch.equal(fetch(server, "big", BIG), tensors["big"])  # a large reply uses a send thread
        assert threading.active_count() <= before_py + DEFAULT_SEND_THREADS
    finally:
        for sock in idle + silent:
            sock.close()


def test_connections_over_the_limit_are_closed_at_once_and_a_freed_slot_serves_again(make_server, tensors):
    server = make_server(max_connections=5)
    held = [authenticated(server) for _ in range(5)]
    extra = socket.create_connection((server.host, server.port), timeout=5)
    assert read_all_until_closed(extra, timeout=5) == b""  # not even a nonce
    assert server.refused == 1
    held.pop().close()
    deadline = time.monotonic() + 5
    while server.connections > 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert torch.equal(fetch(server, "small", 4000).view(torch.float32), tensors["small"])
    for sock in held:
        sock.close()


def test_a_silent_peer_gives_its_slot_back_after_the_handshake_timeout(make_server):
    server = make_server(handshake_timeout_s=0.3)
    silent = socket.create_connection((server.host, server.port), timeout=5)
    start = time.monotonic()
    assert len(read_all_until_closed(silent, timeout=5)) == auth.NONCE_BYTES  # the nonce, then closed
    took = time.monotonic() - start
    assert 0.2 < took < 2.0, took
    deadline = time.monotonic() + 2
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.connections == 0


def test_large_replies_to_many_readers_at_once_and_a_stalled_reader_blocks_no_one(make_server, tensors):
    server = make_server()
    stalled = authenticated(server)
    stalled.sendall(struct.pack("!I", 3) + b"big")  # asks for 16 MB and never reads it
    results: list[bool] = []

    def reader() -> None:
        client = TensorClient(SECRET)
        results.extend(torch.equal(fetch(server, "big", BIG, client), tensors["big"]) for _ in range(3))
        client.close()

    threads = [threading.Thread(target=reader) for _ in range(2 * DEFAULT_SEND_THREADS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * (6 * DEFAULT_SEND_THREADS), "a reply was lost or corrupted"
    assert time.monotonic() - start < 30
    stalled.close()


def fake_server(reply: bytes):
    """An authenticated server (it knows the secret) that answers any request with ``reply``."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        nonce = auth.new_nonce()
        conn.sendall(nonce)
        answer = recv_n(conn, auth.NONCE_BYTES + auth.PROOF_BYTES)
        conn.sendall(auth.proof(SECRET, b"server", answer[: auth.NONCE_BYTES], nonce))
        recv_n(conn, 4 + 1)
        conn.sendall(reply)
        time.sleep(2)
        conn.close()
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


@pytest.mark.parametrize(
    "status, length, error",
    [
        (MISSING, 1 << 40, f"announced a {1 << 40}-byte error message \\(limit {MAX_MESSAGE_BYTES}\\)"),
        (OK, 1 << 40, f"sent {1 << 40} bytes, handle says 4"),
    ],
)
def test_the_client_allocates_nothing_from_a_length_the_server_names(status, length, error):
    port = fake_server(REPLY.pack(status, length))
    into = torch.empty(4, dtype=torch.uint8)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=error):
            TensorClient(SECRET).fetch("127.0.0.1", port, "k", into)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
