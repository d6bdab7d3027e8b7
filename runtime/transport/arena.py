"""A first-fit byte allocator over one pre-allocated buffer (offsets only, no memory).

The shared-memory arena and the Mooncake registered buffer are each allocated once
per process and carved into slots with this; slots are returned when their owner
(a request) is freed, and neighbouring free ranges coalesce so large tensors fit
again after many small ones.
"""

from __future__ import annotations

import bisect

ALIGN = 64  # cache-line aligned slots: copies into and out of them run at full speed


class SlotAllocator:
    """Not thread-safe: the caller (TensorExchange) holds its lock around every call."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[tuple[int, int]] = [(0, size)] if size else []  # (offset, length), sorted
        self._used: dict[int, int] = {}  # offset -> length

    @staticmethod
    def _round(nbytes: int) -> int:
        return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a new slot of at least ``nbytes`` bytes, or None when nothing fits."""
        need = self._round(nbytes)
        for i, (offset, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    del self._free[i]
                else:
                    self._free[i] = (offset + need, length - need)
                self._used[offset] = need
                return offset
        return None

    def free(self, offset: int) -> None:
        length = self._used.pop(offset)
        i = bisect.bisect_left(self._free, (offset, 0))
        # Merge with the following free range, then with the preceding one.
        if i < len(self._free) and offset + length == self._free[i][0]:
            length += self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            prev_offset, prev_length = self._free[i - 1]
            self._free[i - 1] = (prev_offset, prev_length + length)
        else:
            self._free.insert(i, (offset, length))

    @property
    def free_bytes(self) -> int:
        return sum(length for _, length in self._free)

    @property
    def slots_in_use(self) -> int:
        return len(self._used)
