"""Mooncake transfer engine endpoint: exported tensors live in one registered buffer.

Mooncake (TCP here, RDMA where the hardware has it) is the cross-host transport; on
one host shared memory is faster. Each process registers an arena (its FIRST
registered buffer, so a peer finds its base with get_first_buffer_address) and a
scratch buffer it reads into. A handle's ``offset`` is relative to that arena base;
overflow buffers, registered per tensor, get an offset relative to the same base.
The package is optional: it is imported only when a Mooncake endpoint is made.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from mstar.transport.codec import memcpy

SCRATCH_MAX = 16 << 20  # the reader copies out through this much registered memory at a time


def import_transfer_engine() -> Any:
    # Mooncake logs every connection at INFO to stderr; it reads the level at import. A user's own
    # MC_LOG_LEVEL still wins.
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise ImportError(
            "the mooncake transport needs the Mooncake transfer engine: "
            "pip install 'mstar_ros[mooncake]' (mooncake-transfer-engine-non-cuda; "
            f"on Debian also apt-get install libibverbs1): {exc}"
        ) from exc
    return TransferEngine


class MooncakeEndpoint:
    """Not thread-safe for writes: the TensorExchange allocates arena slots under its lock."""

    def __init__(self, host: str, arena_bytes: int) -> None:
        self.engine = import_transfer_engine()()
        rc = self.engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, tcp) failed: {rc}")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        self.arena = self._register(torch.zeros(max(arena_bytes, 64), dtype=torch.uint8))  # zeros: pages touched now
        self._scratch = self._register(torch.zeros(min(max(arena_bytes, 64), SCRATCH_MAX), dtype=torch.uint8))
        self._overflow: dict[int, torch.Tensor] = {}  # relative offset -> its own registered buffer
        self._bases: dict[str, int] = {}  # peer session -> its arena's address
        self._read_lock = threading.Lock()  # one scratch buffer: one read at a time

    def _register(self, buf: torch.Tensor) -> torch.Tensor:
        rc = self.engine.register_memory(buf.data_ptr(), buf.numel())
        if rc != 0:
            raise RuntimeError(f"Mooncake register_memory of {buf.numel()} bytes failed: {rc}")
        return buf

    def address(self, offset: int) -> int:
        """Where arena ``offset`` is in this process (the writer copies the tensor there)."""
        return self.arena.data_ptr() + offset

    def add_overflow(self, nbytes: int) -> tuple[int, int]:
        """A registered buffer of its own for a tensor that does not fit the arena."""
        buf = self._register(torch.empty(nbytes, dtype=torch.uint8))
        offset = buf.data_ptr() - self.arena.data_ptr()
        self._overflow[offset] = buf
        return offset, buf.data_ptr()

    def drop_overflow(self, offset: int) -> None:
        buf = self._overflow.pop(offset)
        self.engine.unregister_memory(buf.data_ptr())

    def read(self, session: str, offset: int, dst: int, count: int, key: str) -> None:
        """Copies ``count`` bytes at ``offset`` of the peer's arena to address ``dst``."""
        if count == 0:
            return
        with self._read_lock:
            base = self._bases.get(session)
            if base is None:
                base = self.engine.get_first_buffer_address(session)
                if not base:
                    raise KeyError(f"tensor {key}: no Mooncake peer at {session} (or it registered no memory)")
                self._bases[session] = base
            chunk, scratch = self._scratch.numel(), self._scratch.data_ptr()
            for pos in range(0, count, chunk):
                n = min(chunk, count - pos)
                rc = self.engine.transfer_sync_read(session, scratch, base + offset + pos, n)
                if rc < 0:
                    self._bases.pop(session, None)  # look the base up again next time (peer restart)
                    raise KeyError(
                        f"tensor {key}: Mooncake read of {n} bytes at offset {offset + pos} "
                        f"from {session} failed ({rc}): freed, or the peer restarted"
                    )
                memcpy(dst + pos, scratch, n)

    def close(self) -> None:
        for offset in list(self._overflow):
            self.drop_overflow(offset)
        for buf in (self.arena, self._scratch):
            self.engine.unregister_memory(buf.data_ptr())
        self._bases.clear()
