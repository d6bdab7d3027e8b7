"""A tensor-parallel group: the collectives a sharded model and the TP leader/followers need.

``TPGroup.init`` joins torch.distributed: gloo when the device is a CPU, NCCL on CUDA
(the choice is made from the device at run time). Step plans travel as msgspec
msgpack bytes in a uint8 tensor over a CPU (gloo) group, never pickled; on CUDA that
is a second, gloo group beside the NCCL one, so plans never touch the GPU stream.
``TPGroup.single()`` is the size-1 group whose collectives do nothing.
"""

from __future__ import annotations

import datetime
from typing import Any, TypeVar

import msgspec
import torch
import torch.distributed as dist

T = TypeVar("T")
# An idle leader sends nothing, and its followers wait inside a broadcast until it does:
# the collective timeout must outlast any idle spell (a dead peer still ends the wait at once).
DEFAULT_TIMEOUT = datetime.timedelta(days=365)
_FRAME = 4096  # first broadcast frame: 8-byte length + payload head (a decode plan fits in one)


class TPGroup:
    """One member (``rank`` of ``size``) of a tensor-parallel group on ``device``."""

    def __init__(
        self,
        rank: int,
        size: int,
        device: torch.device | str = "cpu",
        group: Any = None,
        cpu_group: Any = None,
        owns_default: bool = False,
    ) -> None:
        self.rank = rank
        self.size = size
        self.device = torch.device(device)
        self._group = group
        self._cpu_group = cpu_group
        self._owns_default = owns_default
        self._encoder = msgspec.msgpack.Encoder()
        self._decoders: dict[type, msgspec.msgpack.Decoder] = {}

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> TPGroup:
        return cls(0, 1, device)

    @classmethod
    def init(
        cls,
        rank: int,
        size: int,
        init_method: str,
        device: torch.device | str = "cpu",
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> TPGroup:
        """Joins (creating it if needed) the process group ``init_method`` names, e.g.
        ``tcp://127.0.0.1:29500``: every member calls this with its own rank; it returns
        once all ``size`` members have joined."""
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"tensor parallel: rank {rank} is not in a group of size {size}")
        device = torch.device(device)
        if size == 1:
            return cls.single(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout)
        elif (dist.get_rank(), dist.get_world_size(), dist.get_backend()) != (rank, size, backend):
            raise RuntimeError(
                f"tensor parallel: this process already joined a {dist.get_backend()} group as rank "
                f"{dist.get_rank()} of {dist.get_world_size()}, not {backend} rank {rank} of {size}"
            )
        group = dist.group.WORLD
        cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
        return cls(rank, size, device, group, cpu_group, owns)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        return f"TPGroup(rank={self.rank}, size={self.size}, device={self.device})"

    def destroy(self) -> None:
        """Leaves the process group (if ``init`` created it)."""
        if self._owns_default and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_default = False

    # -- collectives (no-ops for size 1) ------------------------------------------

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place; returns ``t``."""
        if self.size > 1:
            dist.all_reduce(t, group=self._group)
        return t

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Every member's ``t`` concatenated along the last dim, in rank order."""
        if self.size == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t, group=self._group)
        return torch.cat(parts, dim=-1)

    def broadcast(self, obj: Any, type: type[T]) -> T:
        """Rank 0 sends ``obj`` (a msgspec-encodable value of ``type``); every member
        returns it. Followers pass None. A length-prefixed frame, then the rest if any."""
        if self.size == 1:
            return obj
        frame = torch.zeros(_FRAME, dtype=torch.uint8)
        payload = b""
        if self.is_leader:
            payload = self._encoder.encode(obj)
            head = len(payload).to_bytes(8, "little") + payload[: _FRAME - 8]
            frame[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        dist.broadcast(frame, src=0, group=self._cpu_group)
        if self.is_leader:
            rest_len = len(payload) - (_FRAME - 8)
            if rest_len > 0:
                rest = torch.frombuffer(bytearray(payload[_FRAME - 8 :]), dtype=torch.uint8)
                dist.broadcast(rest, src=0, group=self._cpu_group)
            return obj
        data = frame.numpy().tobytes()
        n = int.from_bytes(data[:8], "little")
        payload = data[8 : 8 + n]
        if n > _FRAME - 8:
            rest = torch.empty(n - (_FRAME - 8), dtype=torch.uint8)
            dist.broadcast(rest, src=0, group=self._cpu_group)
            payload += rest.numpy().tobytes()
        decoder = self._decoders.get(type)
        if decoder is None:
            decoder = self._decoders[type] = msgspec.msgpack.Decoder(type)
        return decoder.decode(payload)
