"""Tensor <-> raw bytes without pickle: every transport moves a tensor's bytes as-is.

A tensor crosses a process boundary as its contiguous bytes plus the handle's shape
and dtype. Viewing the tensor as ``uint8`` (rather than ``numpy().tobytes()`` on the
tensor itself) works for every dtype, bfloat16 and bool included, which numpy lacks.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mstar.transport.handle import TensorHandle


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a tensor handle")
    return dtype


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor; a view when it is already contiguous on CPU."""
    # reshape(-1) first: a 0-d tensor cannot change element size in place.
    return contiguous_cpu(tensor).reshape(-1).view(torch.uint8)


def contiguous_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself when its bytes are already one CPU block (the common case: no torch op)."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor
    return tensor.detach().cpu().contiguous()


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def memcpy(dst: int, src: int, count: int) -> None:
    """Copies ``count`` bytes between raw addresses (of tensors or mappings the caller keeps alive).

    Why not ``dst.copy_(src)``: above a grain size torch splits the copy over its OpenMP
    threads, and with two processes on a busy 2-core host a woken worker thread waits a
    whole scheduler tick (4 ms, measured) for a core. memcpy runs on the calling thread,
    ctypes releases the GIL while it runs, and raw addresses skip per-call tensor slicing
    (a 4 KB read costs microseconds, not tens of them). One thread does not saturate
    memory bandwidth, so large copies are split over a few blocked-not-spinning threads.
    """
    if count < _PARALLEL_MIN or _COPY_THREADS < 2:
        if count:
            ctypes.memmove(dst, src, count)
        return
    part = ((count + _COPY_THREADS - 1) // _COPY_THREADS + 63) // 64 * 64  # one cache-aligned piece a thread
    pieces = [(dst + pos, src + pos, min(part, count - pos)) for pos in range(0, count, part)]
    futures = [_pool().submit(ctypes.memmove, *piece) for piece in pieces[1:]]
    ctypes.memmove(*pieces[0])
    for future in futures:
        future.result()


_PARALLEL_MIN = 8 << 20  # below this, handing pieces to threads costs more than it saves
_COPY_THREADS = min(4, len(os.sched_getaffinity(0)))
_pool_instance: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _pool_instance
    with _pool_lock:
        if _pool_instance is None:
            _pool_instance = ThreadPoolExecutor(_COPY_THREADS - 1, thread_name_prefix="mstar-memcpy")
        return _pool_instance


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a flat uint8 view (for recv_into and chunked copies)."""
    return tensor.reshape(-1).view(torch.uint8)


def destination(handle: TensorHandle, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor to read the handle's bytes into: ``out`` when given (checked), else a new one.

    Readers fill it in place (memcpy or recv_into): no transport makes a temporary of the
    payload on the reading side.
    """
    dtype = dtype_from_name(handle.dtype)
    shape = tuple(handle.shape)
    if out is None:
        return torch.empty(shape, dtype=dtype)
    if tuple(out.shape) != shape or out.dtype != dtype or not out.is_contiguous() or out.device.type != "cpu":
        raise ValueError(
            f"out= for tensor {handle.key} must be a contiguous CPU tensor of shape {shape} "
            f"and dtype {handle.dtype}; got {tuple(out.shape)} {dtype_name(out.dtype)}"
        )
    return out


def writable_memoryview(flat: torch.Tensor) -> memoryview:
    """A memoryview on a flat uint8 CPU tensor's memory, for socket.recv_into."""
    return memoryview(flat.numpy()).cast("B")


def encode_inline(tensor: torch.Tensor) -> bytes:
    return byte_view(tensor).numpy().tobytes()


def decode_inline(handle: TensorHandle, out: torch.Tensor | None = None) -> torch.Tensor:
    assert handle.data is not None
    out = destination(handle, out)
    if len(handle.data) != nbytes(out):
        raise ValueError(
            f"inline tensor {handle.key}: {len(handle.data)} bytes, but shape {tuple(handle.shape)} "
            f"{handle.dtype} needs {nbytes(out)}"
        )
    if handle.data:
        flat_bytes(out).numpy()[:] = np.frombuffer(handle.data, dtype=np.uint8)
    return out
