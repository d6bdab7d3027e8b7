"""TensorExchange: the in-process store plus export/read of tensors across processes.

Workers exchange tensors directly, worker to worker: the producer ``export``s a handle
(inline bytes, a shared-memory slot, its TCP tensor server, or its Mooncake buffer)
and sends the handle over the control channel; the consumer's ``get``/``resolve``
reads the bytes from wherever the handle says. Engines see the same API as
:class:`InProcessTensorStore` (put/get/resolve/free_owner/len), so one process with
one worker pays nothing for this.

Lifetimes: an exported slot lives until its owner (request) is freed with
``free_owner``; the consumer must have read it by then (the Conductor frees a request
after its consumers are done). free_owner while an export of the same owner is still
copying is a caller bug (the slot could be reused under the copy).
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Callable

import msgspec
import torch

from mstar.transport.arena import SlotAllocator
from mstar.transport.codec import (
    contiguous_cpu,
    decode_inline,
    destination,
    dtype_from_name,
    dtype_name,
    encode_inline,
    flat_bytes,
    memcpy,
    nbytes,
)
from mstar.transport.handle import TensorHandle
from mstar.transport.inprocess import InProcessTensorStore
from mstar.transport.shm import PeerSegments, ShmSegment, check_tag, segment_prefix, unlink_segments
from mstar.transport.tcp import SECRET_ENV, TensorClient, TensorServer

EXPORT_KINDS = ("inline", "shm", "tcp", "mooncake")


def _unlink_owned(names: set[str]) -> None:
    # Run by close(), or by the finalizer at exit when a process forgot close(): no /dev/shm leak.
    unlink_segments(sorted(names))
    names.clear()


# Below this a copy into a fresh tensor is cheaper than building a view (measured across
# processes: 17 vs 25 us at 4 KB); above it page faults of the fresh tensor dominate
# (64 MB: 34 ms into a fresh tensor, 6 ms into a reused one).
SHM_VIEW_MIN_BYTES = 256 << 10


class TensorExchange(InProcessTensorStore):
    """Thread-safe: put/export/get/resolve/free_owner may run on several threads at once."""

    def __init__(
        self,
        process_tag: str,
        *,
        shm: bool = False,
        tcp_host: str | None = None,
        mooncake_host: str | None = None,
        shm_arena_mb: int = 64,
        secret: bytes | None = None,
    ) -> None:
        """``secret``: what TCP peers must share to read from each other (the Worker pool's token);
        default ``$MSTAR_WORKER_TOKEN``, else one of this process's own (then no peer can read)."""
        super().__init__()
        if secret is None:
            secret = (os.environ.get(SECRET_ENV) or "").encode() or os.urandom(32)
        self.process_tag = check_tag(process_tag)
        self.prefix = segment_prefix(process_tag)
        arena_bytes = int(shm_arena_mb) << 20
        self._owner_of: dict[str, str] = {}  # key -> owner, to charge export slots to the owner
        self._exports: dict[tuple[str, str], TensorHandle] = {}  # (key, kind) -> exported handle (copy once)
        self._releases: dict[str, list[Callable[[], None]]] = {}  # owner -> frees of its export slots
        self._owned: set[str] = set()  # names of the segments we created and have not unlinked yet
        self._finalizer = weakref.finalize(self, _unlink_owned, self._owned)
        self._overflow_ids = itertools.count()
        self._peer_segments = PeerSegments()
        self._client = TensorClient(secret)
        self._arena: ShmSegment | None = None
        self._server: TensorServer | None = None
        self._mooncake = None
        try:
            if shm:
                self._arena = self._create_segment(f"{self.prefix}arena", arena_bytes)
                self._arena.buf.zero_()  # touch every page now, not inside the first copy
            self._arena_slots = SlotAllocator(arena_bytes if shm else 0)
            if tcp_host is not None:
                self._server = TensorServer(tcp_host, self._tensors.get, secret, name=process_tag)
            if mooncake_host is not None:
                from mstar.transport.mooncake import MooncakeEndpoint  # optional dependency: import lazily

                self._mooncake = MooncakeEndpoint(mooncake_host, arena_bytes)
            self._mooncake_slots = SlotAllocator(self._mooncake.arena.numel() if self._mooncake else 0)
        except BaseException:
            self.close()
            raise
        self._readers = {
            "inproc": self._read_inproc,
            "shm": self._read_shm,
            "tcp": self._read_tcp,
            "mooncake": self._read_mooncake,
        }

    # ----------------------------------------------------------------- store
    def put(self, tensor: torch.Tensor, owner: str) -> TensorHandle:
        key = f"{self.process_tag}/{owner}/{next(self._ids)}"  # the tag makes keys unique across processes
        with self._lock:
            self._tensors[key] = tensor
            self._by_owner.setdefault(owner, []).append(key)
            self._owner_of[key] = owner
        return TensorHandle(key, tuple(tensor.shape), dtype_name(tensor.dtype), self.location)

    def free_owner(self, owner: str) -> int:
        with self._lock:
            keys = self._by_owner.pop(owner, [])
            for key in keys:
                self._tensors.pop(key, None)
                self._owner_of.pop(key, None)
                self._exports.pop((key, "shm"), None)
                self._exports.pop((key, "mooncake"), None)
            for release in self._releases.pop(owner, []):
                release()
        return len(keys)

    def get(self, handle: TensorHandle, out: torch.Tensor | None = None) -> torch.Tensor:
        """The handle's tensor. A local key gives the stored tensor itself (no copy, as in-process).
        A shared-memory handle of SHM_VIEW_MIN_BYTES or more gives a view of the producer's
        arena (no copy: valid, and not to be written, until the producer frees the request;
        a fresh tensor of a few MB costs more in page faults than the copy itself). Anything
        else is a new tensor the caller owns; ``out`` is filled in place instead."""
        if handle.data is not None:
            return decode_inline(handle, out)
        local = self._tensors.get(handle.key)
        if local is not None:
            return local if out is None else out.copy_(local)
        scheme, _, where = handle.location.partition(":")
        reader = self._readers.get(scheme)
        if reader is None:
            raise ValueError(
                f"tensor {handle.key}: unknown location scheme {scheme!r} in {handle.location!r} "
                f"(known: inproc, shm:<segment>, tcp:<host>:<port>, mooncake:<session>)"
            )
        if scheme == "inproc":
            self._read_inproc(handle)  # raises: nothing to allocate for
        if scheme == "shm" and out is None and handle.nbytes >= SHM_VIEW_MIN_BYTES:
            return self._view_shm(handle, where)
        out = destination(handle, out)
        if handle.nbytes != nbytes(out):
            raise ValueError(
                f"tensor {handle.key}: handle says {handle.nbytes} bytes, shape "
                f"{tuple(handle.shape)} {handle.dtype} is {nbytes(out)}"
            )
        reader(handle, where, out)
        return out

    # ---------------------------------------------------------------- export
    def export(self, handle: TensorHandle, kind: str) -> TensorHandle:
        """A handle to a tensor of this process that another process can read (see EXPORT_KINDS)."""
        if kind not in EXPORT_KINDS:
            raise ValueError(f"unknown export kind {kind!r}; expected one of {', '.join(EXPORT_KINDS)}")
        tensor = self._tensors.get(handle.key)
        if tensor is None:
            raise KeyError(f"tensor {handle.key} is not in this process's store: only its producer can export it")
        if kind == "inline":
            data = encode_inline(tensor)
            return msgspec.structs.replace(handle, data=data, nbytes=len(data))
        if kind == "tcp":
            if self._server is None:
                raise RuntimeError(f"cannot export {handle.key} over tcp: this exchange was made without tcp_host")
            return msgspec.structs.replace(
                handle, location=f"tcp:{self._server.address}", nbytes=nbytes(tensor), data=None
            )
        cached = self._exports.get((handle.key, kind))
        if cached is not None:
            return cached
        src = contiguous_cpu(tensor)
        count = nbytes(src)
        dst, location, offset = self._slot(handle.key, kind, count)
        memcpy(dst, src.data_ptr(), count)  # outside the lock: other threads export and read meanwhile
        exported = msgspec.structs.replace(handle, location=location, offset=offset, nbytes=count, data=None)
        with self._lock:
            if handle.key in self._owner_of:
                self._exports[(handle.key, kind)] = exported
        return exported

    def _slot(self, key: str, kind: str, count: int) -> tuple[int, str, int]:
        """Reserves ``count`` bytes of export memory, released when the key's owner is freed.
        Returns (its address here, the handle's location, the handle's offset)."""
        if kind == "shm" and self._arena is None:
            raise RuntimeError(f"cannot export {key} to shared memory: this exchange was made with shm=False")
        if kind == "mooncake" and self._mooncake is None:
            raise RuntimeError(f"cannot export {key} over mooncake: this exchange was made without mooncake_host")
        with self._lock:
            owner = self._owner_of.get(key)
            if owner is None:
                raise KeyError(f"tensor {key} was freed while being exported")
            releases = self._releases.setdefault(owner, [])
            slots = self._arena_slots if kind == "shm" else self._mooncake_slots
            offset = slots.alloc(count) if count else 0
            if offset is not None:
                if count:
                    releases.append(lambda: slots.free(offset))
                if kind == "shm":
                    return self._arena.addr + offset, f"shm:{self._arena.name}", offset
                return self._mooncake.address(offset), f"mooncake:{self._mooncake.session}", offset
            if kind == "mooncake":  # does not fit the free space: a buffer of its own, freed with the owner
                offset, addr = self._mooncake.add_overflow(count)
                releases.append(lambda: self._mooncake.drop_overflow(offset))
                return addr, f"mooncake:{self._mooncake.session}", offset
            seg = self._create_segment(f"{self.prefix}ovf{next(self._overflow_ids)}", count)
            releases.append(lambda: self._close_segment(seg))
            return seg.addr, f"shm:{seg.name}", 0

    def _create_segment(self, name: str, size: int) -> ShmSegment:
        seg = ShmSegment(name, size, create=True)
        self._owned.add(name)
        return seg

    def _close_segment(self, seg: ShmSegment) -> None:
        self._owned.discard(seg.name)
        seg.close()

    # ----------------------------------------------------------------- reads
    def _read_inproc(self, handle: TensorHandle, *_: object) -> None:
        raise KeyError(
            f"tensor {handle.key} is not (or no longer) in this process's store; an inproc handle "
            f"is readable only in the process that made it (the producer must export it)"
        )

    def _view_shm(self, handle: TensorHandle, name: str) -> torch.Tensor:
        dtype, shape = dtype_from_name(handle.dtype), tuple(handle.shape)
        expected = torch.Size(shape).numel() * dtype.itemsize
        if handle.nbytes != expected:
            raise ValueError(
                f"tensor {handle.key}: handle says {handle.nbytes} bytes, shape {shape} {handle.dtype} is {expected}"
            )
        if expected == 0:
            return torch.empty(shape, dtype=dtype)
        return self._peer_segments.view(name, handle.offset, handle.nbytes, handle.key).view(dtype).view(shape)

    def _read_shm(self, handle: TensorHandle, name: str, out: torch.Tensor) -> None:
        self._peer_segments.read(name, handle.offset, out.data_ptr(), handle.nbytes, handle.key)

    def _read_tcp(self, handle: TensorHandle, where: str, out: torch.Tensor) -> None:
        host, _, port = where.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"tensor {handle.key}: bad tcp location {handle.location!r} (want tcp:<host>:<port>)")
        self._client.fetch(host, int(port), handle.key, flat_bytes(out))

    def _read_mooncake(self, handle: TensorHandle, session: str, out: torch.Tensor) -> None:
        if self._mooncake is None:
            raise RuntimeError(
                f"cannot read tensor {handle.key} from {handle.location}: this exchange was made without mooncake_host"
            )
        self._mooncake.read(session, handle.offset, out.data_ptr(), handle.nbytes, handle.key)

    # --------------------------------------------------------------- process
    def endpoints(self) -> dict[str, str]:
        """What this process serves, for the placement/handshake: segment name and addresses."""
        found: dict[str, str] = {}
        if self._arena is not None:
            found["shm"] = self._arena.name
        if self._server is not None:
            found["tcp"] = self._server.address
        if self._mooncake is not None:
            found["mooncake"] = self._mooncake.session
        return found

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "tensors": len(self._tensors),
                "arena_bytes": self._arena_slots.size,
                "arena_free_bytes": self._arena_slots.free_bytes,
                "arena_slots": self._arena_slots.slots_in_use,
                "segments": len(self._owned),
                "mooncake_free_bytes": self._mooncake_slots.free_bytes,
            }

    def close(self) -> None:
        """Stops the server, unmaps and unlinks every segment we made, unregisters Mooncake memory."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._client.close()
        with self._lock:
            for releases in self._releases.values():
                for release in releases:
                    release()
            self._releases.clear()
            self._exports.clear()
        if self._arena is not None:
            self._close_segment(self._arena)
            self._arena = None
        self._peer_segments.close()
        if self._mooncake is not None:
            self._mooncake.close()
            self._mooncake = None
        self._finalizer()

    def __enter__(self) -> TensorExchange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
