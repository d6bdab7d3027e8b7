"""The second process of the transport benchmark, and the control channel both ends use.

The channel is what Workers use for control: a plain TCP socket on 127.0.0.1 carrying
length-prefixed msgspec messages (tensors travel as handles, never pickled).
The peer echoes: it reads each incoming tensor through its TensorExchange into a
preallocated tensor, then exports its own tensor of the same size the same way.
"""

from __future__ import annotations

import socket
import struct

import msgspec
import torch

from mstar.transport.exchange import TensorExchange
from mstar.transport.handle import TensorHandle

_LEN = struct.Struct("!I")


class Setup(msgspec.Struct, tag=True):
    kind: str
    nbytes: int


class Ready(msgspec.Struct, tag=True):
    endpoints: dict[str, str] = {}


class Ping(msgspec.Struct, tag=True):
    handle: TensorHandle


class Stop(msgspec.Struct, tag=True):
    pass


Message = Setup | Ready | Ping | Stop


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Message)
        self._header = bytearray(_LEN.size)

    def send(self, msg: Message) -> None:
        payload = self._encoder.encode(msg)
        self.sock.sendall(_LEN.pack(len(payload)) + payload)

    def _recv_exact(self, buf: bytearray) -> None:
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("benchmark peer closed the control channel")
            got += n

    def recv(self) -> Message:
        self._recv_exact(self._header)
        payload = bytearray(_LEN.unpack(self._header)[0])
        self._recv_exact(payload)
        return self._decoder.decode(payload)


def bench_tensor(nbytes: int, seed: int) -> torch.Tensor:
    """float32 payload of ``nbytes`` bytes (sizes are multiples of 4), pages touched."""
    return torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(seed))


def read_reply(exchange: TensorExchange, handle, kind: str, out: torch.Tensor) -> torch.Tensor:
    """Reads a peer's tensor as the runtime does for shared memory (a large one is a view of
    the producer's arena, a small one a fresh copy); the others land in a reused tensor."""
    return exchange.get(handle) if kind == "shm" else exchange.get(handle, out=out)


def peer_main(port: int, tag: str, mooncake: bool, arena_mb: int, threads: int, secret: bytes) -> None:
    torch.set_num_threads(threads)
    exchange = TensorExchange(
        tag,
        shm=True,
        tcp_host="127.0.0.1",
        mooncake_host="127.0.0.1" if mooncake else None,
        shm_arena_mb=arena_mb,
        secret=secret,
    )
    channel = Channel(socket.create_connection(("127.0.0.1", port)))
    kind, out, reply, n = "shm", torch.empty(0), torch.empty(0), 0
    try:
        while True:
            msg = channel.recv()
            if isinstance(msg, Setup):
                kind, out, reply = msg.kind, torch.empty(msg.nbytes // 4), bench_tensor(msg.nbytes, 1)
                channel.send(Ready(exchange.endpoints()))
            elif isinstance(msg, Ping):
                read_reply(exchange, msg.handle, kind, out)
                exchange.free_owner(f"echo{n}")  # the previous reply: the driver has read it by now
                n += 1
                channel.send(Ping(exchange.export(exchange.put(reply, f"echo{n}"), kind)))
            elif isinstance(msg, Stop):
                return
    finally:
        channel.sock.close()
        exchange.close()
