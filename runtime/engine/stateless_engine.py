"""The stateless engine: batches calls of the same node across requests (encoders, decoders, codecs).

A more urgent priority class goes first (mstar.priority; ``priority_classes=False``: every
call alike), and within a class first chunks go first: a call that is a request's first
(index 0) jumps ahead of later chunks of other requests, so time to first output stays low
under load. Later chunks may wait up to ``max_wait_s`` to be batched with others; a
control-class call never waits to be batched.
A batch that fails is retried call by call, so one bad input fails one request.
A node with ``sequential_calls`` (state kept between a request's calls) gets a request's
calls one at a time, in index order, whatever order they come in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from mstar.engine.compiled_node import compile_nodes
from mstar.engine.engine_inbox import EngineInbox, InboxMessage, Reply
from mstar.engine.messages import ExecuteNode, NodeOutput, ReleaseRequest
from mstar.engine.serve_order import call_class
from mstar.graph.node import NodeCall, NodeSubmodule
from mstar.layers.linear_packing import pack_linears
from mstar.layers.weight_only import check_quantization_device, quantize_module
from mstar.priority import Priority
from mstar.transport.inprocess import InProcessTensorStore

log = logging.getLogger("mstar.engine.stateless")


@dataclass
class _Pending:
    msg: ExecuteNode
    reply: Reply
    call: NodeCall
    arrival: float = field(default_factory=time.monotonic)

    def order(self, classes_on: bool) -> tuple[int, int, float]:
        """Serving order: class, then first chunks, then arrival."""
        return (int(call_class(self.msg, classes_on)), 0 if self.call.index == 0 else 1, self.arrival)


class StatelessEngine(EngineInbox):
    def __init__(
        self,
        nodes: Mapping[str, NodeSubmodule],
        store: InProcessTensorStore,
        max_batch: int = 16,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        name: str = "stateless",
        max_wait_s: float = 0.0,
        pack: bool = True,
        priority_classes: bool = True,
        quantization: str | Mapping[str, str] = "none",
        compile: bool | str = False,
    ) -> None:
        """``pack``: bf16 linears on CPU get prepacked weights (mstar.layers.linear_packing).
        ``priority_classes``: serve calls by class first (EngineConfig.priority_classes).
        ``quantization``: quantized linears (mstar.layers.weight_only: int8, int4, int8_dynamic, fp16), for
        all nodes or per node. ``compile``: the forwards of nodes that name warm-up batches under
        torch.compile (EngineConfig.compile; mstar.engine.compiled_node)."""
        super().__init__()
        self.device = torch.device(device)
        modes = [quantization] if isinstance(quantization, str) else list(quantization.values())
        for mode in modes:
            check_quantization_device(mode, self.device, name)
        self.nodes = {n: m.to(device=self.device, dtype=dtype).eval() for n, m in nodes.items()}
        done: dict[int, tuple[str, str]] = {}  # views share a module: quantize it once, with one mode
        for node, module in self.nodes.items():
            mode = quantization if isinstance(quantization, str) else quantization.get(node, "none")
            first = done.get(id(module))
            if first is None:
                done[id(module)] = (node, mode)
                quantize_module(module, mode)
            elif first[1] != mode:
                raise ValueError(
                    f"{name}: quantization: nodes {first[0]!r} ({first[1]}) and {node!r} ({mode}) share one "
                    "module and so must have one quantization"
                )
        if pack:
            for module in self.nodes.values():
                pack_linears(module, module.plain_linears)
        self._compiled = compile_nodes(
            self.nodes,
            self.device,
            name,
            compile,
            lambda node: quantization if isinstance(quantization, str) else quantization.get(node, "none"),
        )
        self.store = store
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.name = name
        self.priority_classes = priority_classes
        self._pending: list[_Pending] = []
        # (node, request) -> the index of its next call, for nodes with sequential_calls
        self._next_index: dict[tuple[str, str], int] = {}
        self.batches = 0
        self.calls = 0
        self.busy_seconds = 0.0

    def stats(self) -> dict[str, int]:
        return {
            "batches": self.batches,
            "calls": self.calls,
            "pending": len(self._pending),
            "busy_ms": int(self.busy_seconds * 1000),
        }

    # -- device thread (DeviceLoop) -------------------------------------------------
    def has_work(self) -> bool:
        """A batch is due: a first chunk waits (time to first output), a full batch is ready,
        or the oldest call has waited ``max_wait_s``. Otherwise waiting a little gathers a
        bigger batch, which costs less per call; the device loop still runs us when idle."""
        ready = self._ready()
        if not ready:
            return False
        if len(ready) >= self.max_batch or any(p.call.index == 0 for p in ready):
            return True
        if any(call_class(p.msg, self.priority_classes) == Priority.CONTROL for p in ready):
            return True  # a control call does not wait for company
        return time.monotonic() - min(p.arrival for p in ready) >= self.max_wait_s

    def most_urgent(self, pending: bool = False) -> Priority | None:
        """The most urgent class of the calls due now (``pending``: of every queued call); None: none."""
        calls = self._pending if pending else (self._ready() if self.has_work() else [])
        return min((call_class(p.msg, self.priority_classes) for p in calls), default=None)

    def has_pending(self) -> bool:
        return bool(self._pending)

    def _ready(self) -> list[_Pending]:
        """The calls that may run now: a sequential node's call waits for its request's previous one."""
        return [
            p
            for p in self._pending
            if not self.nodes[p.msg.node].sequential_calls
            or p.call.index == self._next_index.get((p.msg.node, p.msg.request_id), 0)
        ]

    def _answer(self, item: _Pending, out: NodeOutput) -> None:
        if self.nodes[item.msg.node].sequential_calls:
            self._next_index[(item.msg.node, item.msg.request_id)] = item.call.index + 1
        item.reply(out)

    def step(self, limit: Priority | None = None) -> None:
        """One batch of its most urgent due calls (the device round steps it only when they are within
        ``limit``, so ``limit`` needs no check here)."""
        batch = self._next_batch()
        if batch:
            self._run_batch(batch)

    def _handle(self, msg: InboxMessage, reply: Reply | None = None) -> None:
        if isinstance(msg, ReleaseRequest):
            request_id = msg.request_id
            self.store.free_owner(request_id)  # outputs made after the Conductor let go of the request
            self._pending = [p for p in self._pending if p.msg.request_id != request_id]
            for node, module in self.nodes.items():
                if module.sequential_calls:
                    self._next_index.pop((node, request_id), None)
                    module.release(request_id)
            return
        if not isinstance(msg, ExecuteNode):
            return
        try:
            if msg.node not in self.nodes:
                raise KeyError(f"node {msg.node!r} is not served by engine {self.name!r}")
            inputs = {k: self.store.resolve(ref) for k, ref in msg.inputs.items()}
        except Exception as exc:
            reply(NodeOutput(msg.call_id, msg.request_id, 0, final=True, error=f"{type(exc).__name__}: {exc}"))
            return
        call = NodeCall(msg.request_id, inputs, index=msg.index, seed=msg.seed, meta=dict(msg.meta))
        self._pending.append(_Pending(msg, reply, call))

    def _key(self, item: _Pending):
        try:
            return self.nodes[item.msg.node].batch_key(item.call)
        except Exception as exc:  # a call whose inputs a node cannot even look at: fail it alone
            return exc

    def _next_batch(self) -> list[_Pending]:
        ready = self._ready()
        if not ready:
            return []

        def order(p: _Pending) -> tuple[int, int, float]:
            return p.order(self.priority_classes)

        head = min(ready, key=order)
        key = self._key(head)
        if isinstance(key, Exception):
            self._pending.remove(head)
            self._answer(
                head,
                NodeOutput(
                    head.msg.call_id,
                    head.msg.request_id,
                    0,
                    final=True,
                    error=f"node {head.msg.node!r}: {type(key).__name__}: {key}",
                ),
            )
            return []
        same = sorted((p for p in ready if p.msg.node == head.msg.node and self._key(p) == key), key=order)[
            : self.max_batch
        ]
        chosen = {id(p) for p in same}
        self._pending = [p for p in self._pending if id(p) not in chosen]
        return same

    def _run_batch(self, batch: list[_Pending]) -> None:
        module = self.nodes[batch[0].msg.node]
        started = time.perf_counter()
        try:
            results = self._forward(module, batch)
        except Exception as exc:
            if len(batch) > 1:  # isolate the failing call; the others still get served
                for item in batch:
                    self._run_batch([item])
                return
            item = batch[0]
            log.warning("%s: call of %s for %s failed: %s", self.name, item.msg.node, item.msg.request_id, exc)
            self._answer(
                item,
                NodeOutput(
                    item.msg.call_id,
                    item.msg.request_id,
                    0,
                    final=True,
                    error=f"node {item.msg.node!r}: {type(exc).__name__}: {exc}",
                ),
            )
            return
        self.busy_seconds += time.perf_counter() - started
        self.batches += 1
        self.calls += len(batch)
        for item, outputs in zip(batch, results):
            handles = {k: self.store.put(v, owner=item.msg.request_id) for k, v in outputs.items()}
            self._answer(
                item, NodeOutput(item.msg.call_id, item.msg.request_id, 0, handles, final=True, finish_reason="done")
            )

    def _forward(self, module: NodeSubmodule, batch: list[_Pending]) -> list[dict[str, torch.Tensor]]:
        calls = [p.call for p in batch]
        with torch.inference_mode():
            kwargs = module.prepare_inputs(calls)
            kwargs = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            outputs = self._compiled.get(batch[0].msg.node, module)(**kwargs)
        return [{k: v.detach().cpu() for k, v in out.items()} for out in module.split_outputs(outputs, calls)]
