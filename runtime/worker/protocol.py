"""The Conductor <-> Worker-process wire: msgspec structs, msgpack, length-prefixed frames.

A Worker process connects to the Conductor's control address; the Conductor sends a
Challenge (its nonce); the Worker says Hello with its own nonce and a proof of the pool's
token; the Conductor answers Welcome (its proof back) and Setup (what to build); the
Worker answers Ready (what it serves) or SetupFailed. Both proofs are HMACs over both
nonces (``mstar.worker.handshake``): the token never crosses the wire, and neither side
acts on the other's messages before the other has proved it holds the token. After
that the node messages of ``mstar.engine.messages`` flow. Never pickle: every frame
decodes into one of the structs of ``Message``.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
from typing import Any

import msgspec

from mstar.engine.config import EngineConfig
from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, FeedInput, KVExported, NodeOutput, ReleaseRequest
from mstar.transport.tcp import SECRET_ENV

MAX_FRAME = 1 << 30  # the largest frame encode_frame sends; a longer announced length is refused unread
READ_CHUNK = 1 << 20  # a frame's buffer grows by what has arrived, never by what its header announces
MAX_HELLO = 64 << 10  # before a peer has shown the token, it may send only this much
TOKEN_ENV = SECRET_ENV  # the token travels in the environment, not in argv (ps shows argv)


class FrameTooLarge(ValueError):
    """A frame over the limit, to send or announced by a peer (then refused before it is read)."""


def worker_tag(token: str, rank: int, pid: int) -> str:
    """Names a Worker process's shared-memory segments without revealing the token."""
    return f"{hashlib.sha256(token.encode()).hexdigest()[:10]}r{rank}p{pid}"


class ModelSpec(msgspec.Struct, frozen=True):
    """How a Worker process builds a model: ``model`` is a name registered on the Worker's side
    (``mstar.worker.registry``: an installed graph package's entry point), never code to import.
    Its factory is called as ``factory(nodes=set_of_hosted_nodes, tp=TPGroup_or_None, **kwargs)``
    and returns ``(ModelGraph, {module name: NodeSubmodule})`` for the hosted nodes only."""

    model: str
    kwargs: dict[str, Any] = {}


class TensorParallel(msgspec.Struct, frozen=True):
    rank: int
    size: int
    init_method: str  # tcp://host:port of the group's rendezvous


class Challenge(msgspec.Struct, tag=True):
    nonce: bytes  # the Conductor's


class Hello(msgspec.Struct, tag=True):
    rank: int
    pid: int
    host: str
    nonce: bytes  # the Worker's
    proof: bytes  # HMAC of the token over both nonces and the fields above (mstar.worker.handshake)


class Welcome(msgspec.Struct, tag=True):
    proof: bytes  # the Conductor's HMAC of the token over both nonces, checked before Setup is read


class Setup(msgspec.Struct, tag=True):
    spec: ModelSpec
    nodes: list[str]
    config: EngineConfig
    device: str = "cpu"
    threads: int = 0  # torch threads; 0 leaves torch's default
    transports: list[str] = []  # which of shm / tcp / mooncake this Worker serves
    host: str = "127.0.0.1"  # address its tensor servers listen on
    tp: TensorParallel | None = None
    # names of Worker plugins registered on the Worker's side (mstar.worker.registry), each called
    # with the WorkerHost once it serves (e.g. a ROS status node); the runtime knows nothing of them
    plugins: list[str] = []
    quantization: dict[str, str] = {}  # node -> weight-only quantization its placement group sets


class Ready(msgspec.Struct, tag=True):
    endpoints: dict[str, str]
    segment_prefix: str  # shared-memory segments this process creates start with it
    dtype: str = ""  # what its engines run (``auto`` decided for its own device) ...
    dtype_reason: str = ""  # ... and why


class SetupFailed(msgspec.Struct, tag=True):
    error: str


class StatsRequest(msgspec.Struct, tag=True):
    seq: int


class WorkerStats(msgspec.Struct, tag=True):
    seq: int
    engines: dict[str, dict[str, int]]
    kv_blocks_used: int
    tensors_held: int


class Shutdown(msgspec.Struct, tag=True):
    pass


Message = (
    Challenge
    | Hello
    | Welcome
    | Setup
    | Ready
    | SetupFailed
    | StatsRequest
    | WorkerStats
    | Shutdown
    | ExecuteNode
    | NodeOutput
    | ReleaseRequest
    | CloseSession
    | ExportKV
    | KVExported
    | FeedInput
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_HEADER = struct.Struct("!I")


def encode_frame(msg: Message) -> bytes:
    body = _encoder.encode(msg)
    if len(body) > MAX_FRAME:
        raise FrameTooLarge(
            f"a {type(msg).__name__} of {len(body)} bytes is over the {MAX_FRAME}-byte frame limit "
            f"(inline values are for small tensors)"
        )
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes | bytearray) -> Message:
    return _decoder.decode(body)


def frame_length(header: bytes, limit: int = MAX_FRAME) -> int:
    (n,) = _HEADER.unpack(header)
    if n > limit:
        raise FrameTooLarge(f"a control frame of {n} bytes was announced, over the {limit}-byte limit")
    return n


HEADER_SIZE = _HEADER.size


class BlockingChannel:
    """The Worker side: a blocking socket; any thread may send (a lock keeps frames whole)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, msg: Message) -> None:
        data = encode_frame(msg)
        with self._send_lock:
            self.sock.sendall(data)

    def recv(self, limit: int = MAX_FRAME) -> Message | None:
        """The next message, or None when the peer closed the connection between frames (mid-frame:
        ConnectionError). ``limit``: the largest frame accepted (MAX_HELLO before the peer has proved
        it holds the token)."""
        header = self._recv_up_to(HEADER_SIZE)
        if not header:
            return None
        if len(header) < HEADER_SIZE:
            raise ConnectionError("the Conductor closed the connection inside a frame header")
        n = frame_length(header, limit)
        body = self._recv_up_to(n)
        if len(body) < n:
            raise ConnectionError(
                f"the Conductor closed the connection after {len(body)} of the {n} bytes its frame announced"
            )
        return decode_body(body)

    def _recv_up_to(self, n: int) -> bytearray:
        """``n`` bytes, or fewer if the peer closes first; the buffer grows as they arrive, so an
        announced length the peer never sends costs nothing."""
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), READ_CHUNK))
            if not chunk:
                break
            buf += chunk
        return buf

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
