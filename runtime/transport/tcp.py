"""TCP tensor server and client: peers ask "give me key K" and get the raw bytes.

Every connection opens with a mutual proof of a shared secret (the Worker pool's token):
the server sends a nonce, the client answers with its own nonce and
HMAC-SHA256(secret, "client" | server nonce | client nonce), the server replies with
HMAC-SHA256(secret, "server" | client nonce | server nonce). The secret never crosses the
wire; a peer without it gets nothing, and a client never reads tensors from a server
that cannot prove it holds the secret. (No encryption: the bytes of tensors travel in the
clear, as on any plain TCP link.)

Then (no pickle): request ``!I`` key length + UTF-8 key; reply ``!BQ`` status + length,
then the tensor's bytes (status 0) or a UTF-8 error message (status 1). Connections are
persistent (one handshake per peer pair, not per tensor), and the reader receives
straight into the destination tensor's memory with recv_into.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
from typing import Callable

import torch

from mstar.transport.codec import byte_view, writable_memoryview

log = logging.getLogger(__name__)

_REQUEST = struct.Struct("!I")
_REPLY = struct.Struct("!BQ")
_OK, _MISSING = 0, 1
_SMALL = 64 * 1024  # below this, header and payload go out in one send (one TCP segment)
_NONCE = 16
_MAC = hashlib.sha256().digest_size
HANDSHAKE_TIMEOUT_S = 10.0
SECRET_ENV = "MSTAR_WORKER_TOKEN"  # the Worker pool's token: the shared secret of its tensor servers


class TensorAuthError(ConnectionError):
    """The peer could not prove it holds the shared secret (or refused ours)."""


def _proof(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 8:
        raise ValueError("the tensor server needs a shared secret of at least 8 bytes (the Worker pool's token)")
    return bytes(secret)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("tensor peer closed the connection mid-message")
        got += n


def _nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # latency: never wait to coalesce
    return sock


class TensorServer:
    """Serves tensors by key from a background thread (one more thread per peer connection).

    ``lookup(key)`` returns the tensor or None when this process does not (or no longer) hold it.
    """

    def __init__(self, host: str, lookup: Callable[[str], torch.Tensor | None], secret: bytes,
                 name: str = "tensors") -> None:
        self._secret = _check_secret(secret)
        self._lookup = lookup
        self._sock = socket.create_server((host, 0))
        self.host, self.port = host, self._sock.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept_loop, name=f"{name}-tcp-accept", daemon=True).start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by stop()
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(_nodelay(conn))
            threading.Thread(target=self._serve, args=(conn,), name="tensor-tcp-conn", daemon=True).start()

    def _authenticate(self, conn: socket.socket) -> bool:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)  # a silent peer does not hold a thread forever
        server_nonce = os.urandom(_NONCE)
        conn.sendall(server_nonce)
        answer = bytearray(_NONCE + _MAC)
        _recv_exact(conn, memoryview(answer))
        client_nonce, proof = bytes(answer[:_NONCE]), bytes(answer[_NONCE:])
        if not hmac.compare_digest(proof, _proof(self._secret, b"client", server_nonce, client_nonce)):
            log.warning("tensor server %s: refused a connection from %s without the pool's token",
                        self.address, conn.getpeername())
            return False
        conn.sendall(_proof(self._secret, b"server", client_nonce, server_nonce))
        conn.settimeout(None)
        return True

    def _serve(self, conn: socket.socket) -> None:
        header = bytearray(_REQUEST.size)
        try:
            if not self._authenticate(conn):
                return
            while True:
                _recv_exact(conn, memoryview(header))
                key_bytes = bytearray(_REQUEST.unpack(header)[0])
                _recv_exact(conn, memoryview(key_bytes))
                key = key_bytes.decode()
                tensor = self._lookup(key)
                if tensor is None:
                    msg = f"tensor {key} is not (or no longer) held by the tensor server at {self.address}".encode()
                    conn.sendall(_REPLY.pack(_MISSING, len(msg)) + msg)
                    continue
                payload = byte_view(tensor).numpy()
                if payload.nbytes < _SMALL:
                    conn.sendall(_REPLY.pack(_OK, payload.nbytes) + payload.tobytes())
                else:
                    conn.sendall(_REPLY.pack(_OK, payload.nbytes))
                    conn.sendall(memoryview(payload))
        except (ConnectionError, OSError):
            pass  # the peer went away (or never finished the handshake), or stop() closed us
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        for sock in [self._sock, *conns]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept/recv
            except OSError:
                pass
            sock.close()


class TensorClient:
    """Fetches tensors from peers' servers over a pool of persistent connections per peer."""

    def __init__(self, secret: bytes) -> None:
        self._secret = _check_secret(secret)
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()

    def _connect(self, host: str, port: int) -> socket.socket:
        sock = _nodelay(socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT_S))
        try:
            server_nonce = bytearray(_NONCE)
            _recv_exact(sock, memoryview(server_nonce))
            client_nonce = os.urandom(_NONCE)
            sock.sendall(client_nonce + _proof(self._secret, b"client", bytes(server_nonce), client_nonce))
            proof = bytearray(_MAC)
            try:
                _recv_exact(sock, memoryview(proof))
            except ConnectionError:
                raise TensorAuthError(f"the tensor server at {host}:{port} refused this process: it does not hold "
                                      "the same Worker pool token") from None
            if not hmac.compare_digest(bytes(proof), _proof(self._secret, b"server", client_nonce, bytes(server_nonce))):
                raise TensorAuthError(f"the tensor server at {host}:{port} could not prove it holds this pool's "
                                      "token: not reading from it")
            sock.settimeout(None)
            return sock
        except BaseException:
            sock.close()
            raise

    def fetch(self, host: str, port: int, key: str, into: torch.Tensor) -> None:
        """Reads tensor ``key`` into the flat uint8 tensor ``into`` (its exact size)."""
        peer = (host, port)
        with self._lock:
            pool = self._idle.setdefault(peer, [])
            sock = pool.pop() if pool else None
        if sock is None:
            sock = self._connect(host, port)
        healthy = False
        try:
            key_bytes = key.encode()
            sock.sendall(_REQUEST.pack(len(key_bytes)) + key_bytes)
            header = bytearray(_REPLY.size)
            _recv_exact(sock, memoryview(header))
            status, length = _REPLY.unpack(header)
            if status != _OK:
                msg = bytearray(length)
                _recv_exact(sock, memoryview(msg))
                healthy = True
                raise KeyError(msg.decode())
            if length != into.numel():
                raise ValueError(f"tensor {key}: server at {host}:{port} sent {length} bytes, handle says {into.numel()}")
            _recv_exact(sock, writable_memoryview(into))
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
