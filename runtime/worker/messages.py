"""Conductor <-> Worker control messages (msgspec structs); tensors travel as handles."""
from __future__ import annotations

from typing import Union

import msgspec

from mstar.engine.sampling_params import SamplingParams


class TensorHandle(msgspec.Struct, frozen=True):
    """Names a tensor held by a transport; ``location`` says which (``inproc`` for the embedded store)."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    location: str = "inproc"


# A node input: one tensor, or a list of stream items stacked on the consumer side.
TensorRef = Union[TensorHandle, list[TensorHandle]]


class LoopSpec(msgspec.Struct, frozen=True):
    """An engine-resident loop: the node feeds itself its own output each iteration."""

    max_iters: int | None = None
    stop_values: tuple[int, ...] = ()


class ExecuteNode(msgspec.Struct):
    call_id: int
    request_id: str
    node: str
    inputs: dict[str, TensorRef]
    index: int = 0
    seed: int = 0
    sampling: SamplingParams | None = None
    loop: LoopSpec | None = None
    session_id: str | None = None
    mask: int = 0
    mask_arg: int = 0
    kv_window: int | None = None
    kv_from: str | None = None
    meta: dict[str, int] = {}


class NodeOutput(msgspec.Struct):
    """One iteration's outputs of a call; the call's last message has ``final=True``."""

    call_id: int
    request_id: str
    iteration: int
    outputs: dict[str, TensorHandle] = {}
    final: bool = False
    finish_reason: str | None = None
    error: str | None = None


class ReleaseRequest(msgspec.Struct):
    request_id: str


class CloseSession(msgspec.Struct):
    session_id: str
