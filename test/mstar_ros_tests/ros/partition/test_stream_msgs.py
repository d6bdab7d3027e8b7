"""Stream items as std_msgs MultiArrays: round trips, the header, and what a receiver refuses."""

import pytest
import torch
from std_msgs.msg import Float32MultiArray, Int64MultiArray, MultiArrayDimension

from mstar_ros.ros.partition.stream_msgs import (
    StreamHeader,
    StreamMessageError,
    end_message,
    item_message,
    message_type,
    read_message,
)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(6).reshape(2, 3),
        torch.tensor(5),
        torch.randn(7),
        torch.randn(2, 2, 2, dtype=torch.float64),
        torch.tensor([1, 2], dtype=torch.uint8),
    ],
)
def test_items_round_trip_with_shape_dtype_and_header(tensor):
    msg = item_message(tensor, StreamHeader("req-1", 12, 99))
    assert type(msg) is message_type(tensor.dtype)
    assert msg.layout.dim[0].label == "stream=req-1 seq=12 seed=99"
    header, back = read_message(msg, tensor.dtype)
    assert header == StreamHeader("req-1", 12, 99)
    assert back.dtype == tensor.dtype and torch.equal(back, tensor)


def test_bf16_travels_as_float32_and_end_messages_say_whether_the_producer_failed():
    x = torch.randn(4, dtype=torch.bfloat16)
    msg = item_message(x, StreamHeader("a", 0, 1))
    assert isinstance(msg, Float32MultiArray)
    assert torch.equal(read_message(msg, torch.bfloat16)[1], x)
    assert read_message(end_message(torch.int64, "a", 3), torch.int64) == (StreamHeader("a", 3, end=True), None)
    header, _ = read_message(end_message(torch.int64, "a", 3, failed=True), torch.int64)
    assert header.end and header.failed


def test_malformed_messages_are_refused_with_the_reason():
    def msg(label, data, dims=()):
        m = Int64MultiArray(data=data)
        m.layout.dim = [MultiArrayDimension(label=label, size=1, stride=len(data))] + [
            MultiArrayDimension(label="d0", size=s, stride=s) for s in dims
        ]
        return m

    with pytest.raises(StreamMessageError, match="no layout.dim"):
        read_message(Int64MultiArray(data=[1]), torch.int64)
    with pytest.raises(StreamMessageError, match="is no stream header"):
        read_message(msg("hello", [1], [1]), torch.int64)
    with pytest.raises(StreamMessageError, match="stream id 'a/b' must be"):
        read_message(msg("stream=a/b seq=0 seed=1", [1], [1]), torch.int64)
    with pytest.raises(StreamMessageError, match=r"stream s item 0: 3 values for shape \[2\]"):
        read_message(msg("stream=s seq=0 seed=1", [1, 2, 3], [2]), torch.int64)
    nan = item_message(torch.tensor([1.0, float("nan")]), StreamHeader("s", 0, 1))
    with pytest.raises(StreamMessageError, match="NaN or infinite"):
        read_message(nan, torch.float32)
