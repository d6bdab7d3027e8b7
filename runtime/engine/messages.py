"""Conductor <-> Worker control messages (msgspec structs); tensors travel as handles.

Struct definitions only: the engine, the Worker and the Conductor all speak these, so the
module imports nothing of theirs (a leaf).
"""

from __future__ import annotations

import msgspec

from mstar.graph.loop_mode import LoopMode
from mstar.priority import Priority
from mstar.sampling_params import SamplingParams
from mstar.transport.handle import TensorHandle, TensorRef


class LoopSpec(msgspec.Struct, frozen=True):
    """An engine-resident loop: the node feeds itself its own output each iteration."""

    max_iters: int | None = None
    stop_values: tuple[int, ...] = ()


class KVState(msgspec.Struct, frozen=True):
    """One AR sequence moved between Workers (prefill on one rank, decode on another).

    ``kv`` holds the computed tokens' K and V, [layers, 2, num_computed, kv_heads, head_dim];
    without it (the sequence had been preempted) the receiver recomputes the tokens.
    """

    owner: str
    node: str
    token_ids: list[int]
    history: list[int]
    num_computed: int
    num_generated: int
    first_position: int
    generator_state: bytes
    kv: TensorHandle | None = None
    mask: int = 0
    mask_arg: int = 0
    kv_window: int | None = None
    spans: list[tuple[int, int]] = []  # bidirectional spans, absolute positions (mstar.engine.row_spans)
    row_kinds: list[int] = []  # per-token kinds (mstar.engine.row_kinds); empty: none given


class ExecuteNode(msgspec.Struct, tag=True):
    """Run ``node`` for a request. ``exports`` names, per output port, how to make the
    value readable elsewhere (``inline`` for the Conductor, ``shm``/``tcp``/``mooncake``
    for another Worker); ``kv_import`` seeds the node's KV moved from another Worker."""

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
    exports: dict[str, str] = {}
    kv_import: KVState | None = None
    loop_mode: LoopMode = LoopMode.TOKEN  # which engine loop runs the call (GraphNode.loop_mode)
    fed_inputs: tuple[str, ...] = ()  # ports that grow while the call runs: FeedInput messages follow
    step_rows: bool = False  # each iteration's output carries the rows it computed ("step_<row output>")
    guidance: tuple[str, ...] = ()  # a flow call's guidance views (GraphNode.guidance): a KV branch each
    priority: Priority = Priority.INTERACTIVE  # its request's class (mstar.priority): engines serve urgent first


class NodeOutput(msgspec.Struct, tag=True):
    """One iteration's outputs of a call; the call's last message has ``final=True``."""

    call_id: int
    request_id: str
    iteration: int
    outputs: dict[str, TensorHandle] = {}
    final: bool = False
    finish_reason: str | None = None
    error: str | None = None


class FeedInput(msgspec.Struct, tag=True):
    """More rows for port ``port`` of the running call of ``node`` (a streaming edge into a Loop:
    the Thinker's reply rows reaching the Talker as they are made); ``final``: the stream ended."""

    request_id: str
    node: str
    port: str
    items: list[TensorHandle] = []
    final: bool = False
    session_id: str | None = None


class ReleaseRequest(msgspec.Struct, tag=True):
    request_id: str


class CloseSession(msgspec.Struct, tag=True):
    session_id: str


class ExportKV(msgspec.Struct, tag=True):
    """Hand the (owner, node) sequence's KV to another Worker: reply KVExported, then forget it."""

    call_id: int
    request_id: str
    owner: str
    node: str
    transport: str = "inproc"


class KVExported(msgspec.Struct, tag=True):
    call_id: int
    request_id: str
    state: KVState | None = None
    error: str | None = None
