"""A second real process for the transport tests: it owns a TensorExchange and obeys commands.

Run as ``python peer_process.py PORT AUTHKEY_HEX TAG``; it connects back to the test over
127.0.0.1 (multiprocessing.connection). Handles travel msgspec-encoded as in production;
tensors come back to the test as (shape, dtype, raw bytes) so the test compares bytes.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Client

import msgspec
import torch

from mstar.transport.codec import byte_view, dtype_from_name, dtype_name
from mstar.transport.exchange import TensorExchange
from mstar.transport.handle import TensorHandle


def to_wire(t: torch.Tensor) -> tuple[tuple[int, ...], str, bytes]:
    return tuple(t.shape), dtype_name(t.dtype), byte_view(t).numpy().tobytes()


def from_wire(wire: tuple[tuple[int, ...], str, bytes]) -> torch.Tensor:
    shape, dtype, data = wire
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype_from_name(dtype)).reshape(shape)


def main() -> None:
    port, authkey, tag = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), sys.argv[3]
    exchange = TensorExchange(
        tag,
        shm=True,
        tcp_host="127.0.0.1",
        mooncake_host="127.0.0.1" if os.environ.get("PEER_MOONCAKE") == "1" else None,
        shm_arena_mb=1,
    )
    conn = Client(("127.0.0.1", port), authkey=authkey)
    conn.send(("ready", os.getpid(), exchange.endpoints()))
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "put_export":  # (wire tensor, owner, kind) -> encoded exported handle
                wire, owner, kind = args
                handle = exchange.put(from_wire(wire), owner)
                reply = msgspec.msgpack.encode(exchange.export(handle, kind))
            elif cmd == "resolve":  # encoded handle -> wire tensor read through the exchange
                tensor = exchange.get(msgspec.msgpack.decode(args[0], type=TensorHandle))
                reply = to_wire(tensor)
            elif cmd == "free":
                reply = exchange.free_owner(args[0])
            elif cmd == "stats":
                reply = exchange.stats()
            elif cmd == "close":
                exchange.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown peer command {cmd!r}")
            conn.send(("ok", reply))
        except Exception as exc:  # reported to the test, which asserts on type and message
            conn.send(("error", type(exc).__name__, str(exc)))


if __name__ == "__main__":
    main()
