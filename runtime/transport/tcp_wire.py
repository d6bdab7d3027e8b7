"""The TCP tensor wire, shared by its server and its client.

A connection opens with a mutual proof of a shared secret (the Worker pool's token,
see ``mstar.transport.auth``): the server sends a nonce, the client answers with its own
nonce and HMAC(secret, "client" | server nonce | client nonce), the server replies with
HMAC(secret, "server" | client nonce | server nonce). Then, per tensor (no pickle): request
``!I`` key length + UTF-8 key; reply ``!BQ`` status + length, then the tensor's bytes
(status OK) or a UTF-8 message (MISSING: the stream goes on; REFUSED: the server closes).
"""

from __future__ import annotations

import socket
import struct

from mstar.transport.auth import NONCE_BYTES, PROOF_BYTES

REQUEST = struct.Struct("!I")
REPLY = struct.Struct("!BQ")
OK, MISSING, REFUSED = 0, 1, 2
CLIENT_HELLO_BYTES = NONCE_BYTES + PROOF_BYTES
# Keys are "<process tag>/<request>/<n>": short. A longer one is refused before any buffer is
# made for it, so a peer cannot make a server allocate by naming a length.
MAX_KEY_BYTES = 4096
MAX_MESSAGE_BYTES = 64 << 10  # an error message; a client allocates no more than this for one
HANDSHAKE_TIMEOUT_S = 10.0
SECRET_ENV = "MSTAR_WORKER_TOKEN"  # the Worker pool's token: the shared secret of its tensor servers


class TensorAuthError(ConnectionError):
    """The peer could not prove it holds the shared secret (or refused ours)."""


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("tensor peer closed the connection mid-message")
        got += n


def nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # latency: never wait to coalesce
    return sock
