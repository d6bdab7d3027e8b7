"""TCP tensor transport: peers ask "give me key K" and get the raw bytes.

The server (``mstar.transport.tcp_server``) and this client speak the wire of
``mstar.transport.tcp_wire``: every connection opens with a mutual HMAC proof of the
Worker pool's token (the token never crosses the wire; a peer without it gets nothing,
and a client never reads tensors from a server that cannot prove it holds it). No
encryption: the bytes of tensors travel in the clear, as on any plain TCP link.
Connections are persistent (one handshake per peer pair, not per tensor), and the
reader receives straight into the destination tensor's memory with recv_into.
"""

from __future__ import annotations

import socket
import threading

import torch

from mstar.transport.auth import NONCE_BYTES, PROOF_BYTES, check_secret, new_nonce, proof, proof_matches
from mstar.transport.codec import writable_memoryview
from mstar.transport.tcp_server import TensorServer
from mstar.transport.tcp_wire import (
    HANDSHAKE_TIMEOUT_S,
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    MISSING,
    OK,
    REPLY,
    REQUEST,
    SECRET_ENV,
    TensorAuthError,
    nodelay,
    recv_exact,
)

__all__ = ["HANDSHAKE_TIMEOUT_S", "SECRET_ENV", "TensorAuthError", "TensorClient", "TensorServer"]


class TensorClient:
    """Fetches tensors from peers' servers over a pool of persistent connections per peer."""

    def __init__(self, secret: bytes) -> None:
        self._secret = check_secret(secret)
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()

    def _connect(self, host: str, port: int) -> socket.socket:
        sock = nodelay(socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT_S))
        try:
            server_nonce = bytearray(NONCE_BYTES)
            recv_exact(sock, memoryview(server_nonce))
            client_nonce = new_nonce()
            sock.sendall(client_nonce + proof(self._secret, b"client", bytes(server_nonce), client_nonce))
            server_proof = bytearray(PROOF_BYTES)
            try:
                recv_exact(sock, memoryview(server_proof))
            except ConnectionError:
                raise TensorAuthError(
                    f"the tensor server at {host}:{port} refused this process: it does not hold "
                    "the same Worker pool token"
                ) from None
            if not proof_matches(server_proof, self._secret, b"server", client_nonce, bytes(server_nonce)):
                raise TensorAuthError(
                    f"the tensor server at {host}:{port} could not prove it holds this pool's "
                    "token: not reading from it"
                )
            sock.settimeout(None)
            return sock
        except BaseException:
            sock.close()
            raise

    def fetch(self, host: str, port: int, key: str, into: torch.Tensor) -> None:
        """Reads tensor ``key`` into the flat uint8 tensor ``into`` (its exact size)."""
        key_bytes = key.encode()
        if len(key_bytes) > MAX_KEY_BYTES:
            raise ValueError(
                f"tensor key {key[:80]!r}... is {len(key_bytes)} bytes, over the {MAX_KEY_BYTES}-byte "
                f"limit of tensor servers"
            )
        peer = (host, port)
        with self._lock:
            pool = self._idle.setdefault(peer, [])
            sock = pool.pop() if pool else None
        if sock is None:
            sock = self._connect(host, port)
        healthy = False
        try:
            sock.sendall(REQUEST.pack(len(key_bytes)) + key_bytes)
            header = bytearray(REPLY.size)
            recv_exact(sock, memoryview(header))
            status, length = REPLY.unpack(header)
            # nothing is allocated from a length the server names: it is checked against our own sizes first
            if status != OK:
                if length > MAX_MESSAGE_BYTES:
                    raise ValueError(
                        f"tensor {key}: the server at {host}:{port} announced a {length}-byte error "
                        f"message (limit {MAX_MESSAGE_BYTES})"
                    )
                msg = bytearray(length)
                recv_exact(sock, memoryview(msg))
                text = msg.decode(errors="replace")
                if status == MISSING:
                    healthy = True
                    raise KeyError(text)
                raise ValueError(f"tensor {key}: the server at {host}:{port} refused the request: {text}")
            if length != into.numel():
                raise ValueError(
                    f"tensor {key}: server at {host}:{port} sent {length} bytes, handle says {into.numel()}"
                )
            recv_exact(sock, writable_memoryview(into))
            healthy = True
        finally:
            if healthy:
                with self._lock:
                    self._idle.setdefault(peer, []).append(sock)
            else:
                sock.close()  # the stream is out of step (or broken): never reuse it

    def close(self) -> None:
        with self._lock:
            pools, self._idle = list(self._idle.values()), {}
        for pool in pools:
            for sock in pool:
                sock.close()
