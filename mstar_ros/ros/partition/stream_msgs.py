"""Stream items on ROS topics: one tensor per std_msgs ``*MultiArray`` message, with a stream header.

A stream (one request's items on one graph edge) travels as messages whose layout is
``[1, *item.shape]``; the first dimension's label is the stream header, readable with
``ros2 topic echo``::

    layout: {dim: [{label: 'stream=tts-3 seq=12 seed=7', size: 1, stride: 7}, {label: 'd0', size: 7, ...}]}

``seq`` counts the stream's items from 0, so a receiver notices a lost or reordered
item; ``seed`` is the request's seed (the consumer partition draws its randomness
from it, as it would inside one graph). The last message of a stream has no data and
``end`` in its label. Standard messages only: custom .msg types need a ROS build.
"""

from __future__ import annotations

import array
import re
from dataclasses import dataclass

import torch

#: tensor dtype -> (std_msgs type name, array typecode); bf16/fp16 travel as float32
_TYPES = {
    torch.float32: ("Float32MultiArray", "f"),
    torch.float64: ("Float64MultiArray", "d"),
    torch.int64: ("Int64MultiArray", "q"),
    torch.int32: ("Int32MultiArray", "i"),
    torch.int16: ("Int16MultiArray", "h"),
    torch.uint8: ("UInt8MultiArray", "B"),
    torch.int8: ("Int8MultiArray", "b"),
}
_WIRE_DTYPE = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.bool: torch.uint8}
_DTYPE_OF = {name: dtype for dtype, (name, _) in _TYPES.items()}
STREAM_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_HEADER = re.compile(r"stream=(?P<id>\S+) seq=(?P<seq>\d+)(?: seed=(?P<seed>\d+))?(?P<end> end(?P<failed> failed)?)?")


class StreamMessageError(ValueError):
    """A message that is not a stream item this receiver can use; the text says why."""


@dataclass(frozen=True)
class StreamHeader:
    stream_id: str
    seq: int
    seed: int = 0
    end: bool = False
    failed: bool = False  # an end message: the producer's request failed (the consumer fails it too)

    def label(self) -> str:
        if self.end:
            return f"stream={self.stream_id} seq={self.seq} end" + (" failed" if self.failed else "")
        return f"stream={self.stream_id} seq={self.seq} seed={self.seed}"


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    wired = _WIRE_DTYPE.get(dtype, dtype)
    if wired not in _TYPES:
        raise ValueError(f"no std_msgs MultiArray carries {dtype}")
    return wired


def message_type(dtype: torch.dtype):
    """The std_msgs class carrying items of ``dtype``."""
    import std_msgs.msg

    return getattr(std_msgs.msg, _TYPES[wire_dtype(dtype)][0])


def check_stream_id(stream_id: str) -> str:
    if not STREAM_ID.fullmatch(stream_id):
        raise StreamMessageError(f"stream id {stream_id!r} must be 1-128 of letters, digits, _ . : -")
    return stream_id


def item_message(tensor: torch.Tensor, header: StreamHeader):
    from std_msgs.msg import MultiArrayDimension

    dtype = wire_dtype(tensor.dtype)
    flat = tensor.detach().to("cpu", dtype).contiguous().reshape(-1)
    msg = message_type(dtype)()
    dims = [MultiArrayDimension(label=header.label(), size=1, stride=flat.numel())]
    stride = flat.numel()
    for i, size in enumerate(tensor.shape):
        stride = stride // size if size else 0
        dims.append(MultiArrayDimension(label=f"d{i}", size=int(size), stride=int(stride * size)))
    msg.layout.dim = dims
    msg.data = array.array(_TYPES[dtype][1], flat.numpy().tobytes())
    return msg


def end_message(dtype: torch.dtype, stream_id: str, seq: int, *, failed: bool = False):
    from std_msgs.msg import MultiArrayDimension

    msg = message_type(dtype)()
    msg.layout.dim = [
        MultiArrayDimension(label=StreamHeader(stream_id, seq, end=True, failed=failed).label(), size=0, stride=0)
    ]
    return msg


def read_message(msg, dtype: torch.dtype) -> tuple[StreamHeader, torch.Tensor | None]:
    """(header, item) of a stream message; the item is None for the end message."""
    dims = list(msg.layout.dim)
    if not dims:
        raise StreamMessageError("no layout.dim: not a stream message (the first dim's label is its header)")
    found = _HEADER.fullmatch(dims[0].label)
    if found is None:
        raise StreamMessageError(
            f"layout.dim[0].label {dims[0].label!r} is no stream header "
            "('stream=ID seq=N seed=S' or 'stream=ID seq=N end [failed]')"
        )
    header = StreamHeader(
        check_stream_id(found["id"]),
        int(found["seq"]),
        int(found["seed"] or 0),
        bool(found["end"]),
        bool(found["failed"]),
    )
    if header.end:
        return header, None
    shape = [int(d.size) for d in dims[1:]]
    numel = 1
    for size in shape:
        numel *= size
    data = msg.data
    wired = wire_dtype(dtype)
    if numel == 0 and len(data) == 0:
        return header, torch.empty(shape, dtype=dtype)
    if len(data) != numel:
        raise StreamMessageError(f"stream {header.stream_id} item {header.seq}: {len(data)} values for shape {shape}")
    values = torch.frombuffer(
        bytearray(memoryview(data).cast("B"))
        if isinstance(data, array.array)
        else bytearray(array.array(_TYPES[wired][1], data).tobytes()),
        dtype=wired,
    )
    if wired.is_floating_point and not bool(torch.isfinite(values).all()):
        raise StreamMessageError(f"stream {header.stream_id} item {header.seq}: NaN or infinite values")
    return header, values.reshape(shape).to(dtype)
