"""The TCP tensor server: one event-loop thread for every connection, a few threads for long sends.

Why this shape: connections are persistent (one per peer pair), so most of them sit idle
most of the time; a thread per connection would let peers make threads without bound.
Here one selector thread accepts, runs each handshake as a small state machine (with a
deadline, so a silent peer gives its slot back), reads requests, and answers them with
a non-blocking scatter send (header + the tensor's own memory, no copy). Whatever the
kernel does not take at once (a large tensor, a slow reader) is finished by one of at
most ``send_threads`` threads with a blocking ``sendall`` -- the fast path for big
transfers -- bounded by a send timeout. ``max_connections`` caps the sockets held;
one more is closed at accept. Wire format: ``mstar.transport.tcp_wire``.
"""

from __future__ import annotations

import collections
import logging
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

import torch

from mstar.counted_log import CountedLog
from mstar.transport.auth import NONCE_BYTES, check_secret, new_nonce, proof, proof_matches
from mstar.transport.codec import byte_view
from mstar.transport.tcp_wire import (
    CLIENT_HELLO_BYTES,
    HANDSHAKE_TIMEOUT_S,
    MAX_KEY_BYTES,
    MISSING,
    OK,
    REFUSED,
    REPLY,
    REQUEST,
    nodelay,
)

log = logging.getLogger("mstar.transport.tcp")

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_SEND_THREADS = 4
SEND_TIMEOUT_S = 30.0  # a peer that stops reading mid-tensor frees its send thread after this

_AUTH, _HEADER, _KEY, _BUSY = range(4)


class _Conn:
    __slots__ = ("sock", "peer", "state", "buf", "got", "nonce", "deadline")

    def __init__(self, sock: socket.socket, peer: object, deadline: float) -> None:
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.nonce = new_nonce()
        self.expect(_AUTH, CLIENT_HELLO_BYTES)

    def expect(self, state: int, size: int) -> None:
        self.state, self.buf, self.got = state, bytearray(size), 0


def _remaining(chunks: list[memoryview], sent: int) -> list[memoryview]:
    rest = []
    for chunk in chunks:
        if sent >= len(chunk):
            sent -= len(chunk)
            continue
        rest.append(chunk[sent:])
        sent = 0
    return rest


class TensorServer:
    """Serves tensors by key. ``lookup(key)`` returns the tensor, or None when this process does
    not (or no longer) hold it; it runs on the event-loop thread, so it must be quick (a dict get)."""

    def __init__(
        self,
        host: str,
        lookup: Callable[[str], torch.Tensor | None],
        secret: bytes,
        name: str = "tensors",
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        send_threads: int = DEFAULT_SEND_THREADS,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    ) -> None:
        if max_connections < 1 or send_threads < 1:
            raise ValueError(f"max_connections ({max_connections}) and send_threads ({send_threads}) must be >= 1")
        self._secret = check_secret(secret)
        self._lookup = lookup
        self.max_connections, self.handshake_timeout_s = max_connections, handshake_timeout_s
        self._listener = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.host, self.port = host, self._listener.getsockname()[1]
        self.refused = 0  # connections closed at accept because max_connections were open
        # connections closed for what their peers did, by kind, each kind logged throttled
        self.problems = CountedLog(log, prefix=f"tensor server {self.address}: ")
        self._conns: set[_Conn] = set()
        self._deadlines: collections.deque[_Conn] = collections.deque()  # handshakes, oldest first
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._returns: collections.deque[tuple[_Conn, bool]] = collections.deque()
        self._send_threads, self._max_send_threads, self._idle_senders = [], send_threads, 0
        self._lock = threading.Lock()
        self._closed = self._finished = False
        self._loop_thread = threading.Thread(target=self._run, name=f"{name}-tcp", daemon=True)
        self._loop_thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        return len(self._conns)

    # -- the event loop ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select(self._select_timeout()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data.state != _BUSY:  # a connection handed to a sender was unregistered already
                        self._on_readable(key.data)
                self._expire()
                self.problems.flush()
        except Exception:  # a bug here would silently end all serving: say so, then close what we hold
            log.exception("tensor server %s: event loop failed; closing every connection", self.address)
        finally:
            self._shut_everything()

    def _select_timeout(self) -> float | None:
        """Until the next handshake deadline or the next count of repeated problems to log."""
        due = [
            t
            for t in (self._deadlines[0].deadline if self._deadlines else None, self.problems.next_flush_at())
            if t is not None
        ]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed by stop(), or out of descriptors: the next select tries again
            if len(self._conns) >= self.max_connections:
                self.refused += 1
                self.problems.note(
                    "full", f"refused a connection from {peer}: {len(self._conns)} connections are open (the limit)"
                )
                sock.close()
                continue
            nodelay(sock)
            # honoured by blocking sends only (the senders'), ignored by the non-blocking loop
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", int(SEND_TIMEOUT_S), 0))
            sock.setblocking(False)
            conn = _Conn(sock, peer, time.monotonic() + self.handshake_timeout_s)
            self._conns.add(conn)
            try:
                if sock.send(conn.nonce) != NONCE_BYTES:  # a fresh socket's buffer holds 16 bytes
                    raise ConnectionError("short send of the nonce")
            except OSError:
                self._drop(conn)
                continue
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._deadlines.append(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and (self._deadlines[0].state != _AUTH or self._deadlines[0].deadline <= now):
            conn = self._deadlines.popleft()
            if conn.state == _AUTH and conn in self._conns:
                self.problems.note(
                    "silent",
                    f"closed a connection from {conn.peer} that did not finish the "
                    f"handshake in {self.handshake_timeout_s:g}s",
                    logging.INFO,
                )
                self._drop(conn)

    def _on_readable(self, conn: _Conn) -> None:
        while True:
            try:
                n = conn.sock.recv_into(memoryview(conn.buf)[conn.got :])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                n = 0
            if n == 0 and len(conn.buf) > conn.got:
                self._drop(conn)  # the peer went away
                return
            conn.got += n
            if conn.got < len(conn.buf) or not self._complete(conn):
                return  # level-triggered select says when more has come (no recv that would only fail)

    def _complete(self, conn: _Conn) -> bool:
        """One message of ``conn`` is in. True: read on at once (a key follows its header)."""
        if conn.state == _AUTH:
            client_nonce, client_proof = bytes(conn.buf[:NONCE_BYTES]), bytes(conn.buf[NONCE_BYTES:])
            if not proof_matches(client_proof, self._secret, b"client", conn.nonce, client_nonce):
                self.problems.note("unproven", f"refused a connection from {conn.peer} without the pool's token")
                self._drop(conn)
                return False
            if self._send_small(conn, proof(self._secret, b"server", client_nonce, conn.nonce)):
                conn.expect(_HEADER, REQUEST.size)
            return False  # the peer sends nothing before it has our proof
        if conn.state == _HEADER:
            (length,) = REQUEST.unpack(conn.buf)
            if length > MAX_KEY_BYTES:  # refused before any buffer of that size exists
                self._refuse(conn, f"a tensor key of {length} bytes is over the {MAX_KEY_BYTES}-byte limit")
                return False
            conn.expect(_KEY, length)
            if length:
                return True
        try:
            key = conn.buf.decode()
        except UnicodeDecodeError:
            self._refuse(conn, "the tensor key is not UTF-8")
            return False
        return self._answer(conn, key)

    def _answer(self, conn: _Conn, key: str) -> bool:
        tensor = self._lookup(key)
        if tensor is None:
            msg = f"tensor {key} is not (or no longer) held by the tensor server at {self.address}".encode()
            chunks = [memoryview(REPLY.pack(MISSING, len(msg)) + msg)]
        else:
            payload = byte_view(tensor).numpy()  # shares the tensor's memory and keeps it alive
            chunks = [memoryview(REPLY.pack(OK, payload.nbytes)), memoryview(payload)]
        try:
            sent = conn.sock.sendmsg(chunks)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(conn)
            return False
        rest = _remaining(chunks, sent)
        if rest:
            self._hand_off(conn, rest)
        else:
            conn.expect(_HEADER, REQUEST.size)
        return False

    def _send_small(self, conn: _Conn, data: bytes) -> bool:
        try:
            if conn.sock.send(data) == len(data):
                return True
        except OSError:
            pass
        self._drop(conn)
        return False

    def _refuse(self, conn: _Conn, why: str) -> None:
        self.problems.note("request", f"refused a request from {conn.peer}: {why}")
        msg = why.encode()
        try:
            conn.sock.send(REPLY.pack(REFUSED, len(msg)) + msg)  # best effort: the stream cannot go on anyway
        except OSError:
            pass
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # -- senders: the rest of a reply the kernel did not take at once -------------------
    def _hand_off(self, conn: _Conn, chunks: list[memoryview]) -> None:
        self._sel.unregister(conn.sock)  # no request is read while its reply is still going out
        conn.state = _BUSY
        with self._lock:
            if self._idle_senders == 0 and len(self._send_threads) < self._max_send_threads:
                thread = threading.Thread(target=self._sender, name="tensor-tcp-send", daemon=True)
                self._send_threads.append(thread)
                thread.start()
        self._jobs.put((conn, chunks))

    def _sender(self) -> None:
        while True:
            with self._lock:
                self._idle_senders += 1
            job = self._jobs.get()
            with self._lock:
                self._idle_senders -= 1
            if job is None:
                return
            conn, chunks = job
            ok = True
            try:
                conn.sock.setblocking(True)  # SO_SNDTIMEO (set at accept) bounds a reader that stalls
                for chunk in chunks:
                    conn.sock.sendall(chunk)
                conn.sock.setblocking(False)
            except OSError:
                ok = False
            del chunks
            with self._lock:
                if self._finished:  # the loop is gone: nobody else will close it
                    conn.sock.close()
                    continue
                self._returns.append((conn, ok))
            self._wake()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self._returns:
            conn, ok = self._returns.popleft()
            if not ok:
                self._drop(conn)
                continue
            conn.expect(_HEADER, REQUEST.size)
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)  # level-triggered: a waiting request shows

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already (or we are stopping)

    # -- stop --------------------------------------------------------------------------
    def _shut_everything(self) -> None:
        self.problems.flush(force=True)  # repeats counted but not yet said
        with self._lock:
            self._finished = True
            returned = list(self._returns)
            self._returns.clear()
        for conn, _ in returned:
            conn.sock.close()
        for conn in list(self._conns):
            if conn.state == _BUSY:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)  # its sender fails at once and closes it
                except OSError:
                    pass
            else:
                conn.sock.close()
        self._conns.clear()
        for _ in self._send_threads:
            self._jobs.put(None)
        self._listener.close()
        self._sel.close()
        self._wake_r.close()

    def stop(self) -> None:
        """Closes the listener and every connection; returns once the event loop has ended."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        self._loop_thread.join(timeout=10)
        self._wake_w.close()
