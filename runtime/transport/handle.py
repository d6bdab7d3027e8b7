"""Tensor handles: what travels in a message in place of a tensor's bytes."""

from __future__ import annotations

import msgspec


class TensorHandle(msgspec.Struct, frozen=True):
    """Names a tensor and says where a reader finds its bytes.

    ``location``: ``inproc`` (the store of the process that made it; ``key`` is unique
    across processes), ``shm:<segment>`` (bytes at ``offset`` in a shared-memory segment),
    ``tcp:<host>:<port>`` (ask that tensor server for ``key``), ``mooncake:<session>``
    (bytes at ``offset`` in that transfer engine's registered buffer). A handle with
    ``data`` carries its bytes inline (small tensors the Conductor reads).
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    location: str = "inproc"
    offset: int = 0
    nbytes: int = 0
    data: bytes | None = None


# A node input: one tensor, or a list of stream items stacked on the consumer side.
TensorRef = TensorHandle | list[TensorHandle]
