"""The TCP tensor server talks only to holders of the pool's secret, and the client reads only from them."""

import logging
import re
import socket
import threading
import time

import pytest
import torch

from mstar.counted_log import REPORT_PERIOD_S
from mstar.transport.tcp import HANDSHAKE_TIMEOUT_S, TensorAuthError, TensorClient, TensorServer

SECRET, OTHER = b"pool-token-0123456789", b"another-pool-token-xyz"


@pytest.fixture
def server():
    data = {"t": torch.arange(1000, dtype=torch.float32)}
    s = TensorServer("127.0.0.1", data.get, SECRET)
    yield s
    s.stop()


def read(client: TensorClient, server: TensorServer) -> torch.Tensor:
    into = torch.empty(4000, dtype=torch.uint8)
    client.fetch(server.host, server.port, "t", into)
    return into.view(torch.float32)


def test_a_client_without_the_secret_gets_nothing_and_the_server_keeps_serving(server):
    with pytest.raises(TensorAuthError, match=f"at 127.0.0.1:{server.port} refused this process"):
        read(TensorClient(OTHER), server)
    good = TensorClient(SECRET)
    assert torch.equal(read(good, server), torch.arange(1000, dtype=torch.float32))
    assert torch.equal(read(good, server), torch.arange(1000, dtype=torch.float32))  # the pooled connection


@pytest.mark.slow
def test_a_flood_without_the_secret_is_counted_and_logged_in_two_lines(server, caplog):
    caplog.set_level(logging.INFO, logger="mstar.transport.tcp")
    for _ in range(50):
        with pytest.raises(TensorAuthError):
            read(TensorClient(OTHER), server)
    time.sleep(REPORT_PERIOD_S + 0.5)  # each was refused before its client saw the close; their count is due
    lines = [r.getMessage() for r in caplog.records if r.name == "mstar.transport.tcp"]
    assert len(lines) == 2, lines  # was 50
    said = rf"tensor server {server.address}: refused a connection from \('127.0.0.1', \d+\) without the pool's token"
    assert re.fullmatch(said, lines[0]), lines[0]
    assert re.fullmatch(said + r" \(48 more like this in the last 5\.\d s\)", lines[1]), lines[1]
    assert server.problems.counts == {"unproven": 50}
    assert torch.equal(read(TensorClient(SECRET), server), torch.arange(1000, dtype=torch.float32))


def test_the_client_reads_nothing_from_a_server_that_cannot_prove_the_secret():
    """A server that accepts anyone (it skips the check) but cannot answer with the right proof."""
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor():
        conn, _ = listener.accept()
        conn.sendall(b"n" * 16)
        conn.recv(48)
        conn.sendall(b"p" * 32)  # a proof made without the secret
        conn.recv(1)

    threading.Thread(target=impostor, daemon=True).start()
    try:
        into = torch.empty(4, dtype=torch.uint8)
        with pytest.raises(TensorAuthError, match="could not prove it holds this pool's token"):
            TensorClient(SECRET).fetch("127.0.0.1", listener.getsockname()[1], "t", into)
    finally:
        listener.close()


def test_a_silent_peer_does_not_stall_other_clients(server):
    silent = socket.create_connection((server.host, server.port))  # connects, never answers the nonce
    try:
        start = time.monotonic()
        assert read(TensorClient(SECRET), server)[999] == 999
        assert time.monotonic() - start < HANDSHAKE_TIMEOUT_S / 2
    finally:
        silent.close()


def test_a_short_secret_is_refused():
    with pytest.raises(ValueError, match="at least 8 bytes"):
        TensorClient(b"short")
