"""A Worker hosts graph nodes on one device: one AR engine per AR module (shared by its
views, each view with its own KV), and one stateless engine for the rest.

The Conductor reaches a Worker only through messages (ExecuteNode, FeedInput, ReleaseRequest,
CloseSession) and tensor handles, so a Worker can live in another process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import msgspec
import torch

from mstar.engine.ar_engine import AREngine
from mstar.engine.ar_module import ARModule
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import DeviceLoop
from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, FeedInput, KVExported, NodeOutput, ReleaseRequest
from mstar.engine.stateless_engine import StatelessEngine
from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.transport.inprocess import InProcessTensorStore

log = logging.getLogger("mstar.worker")


class Worker:
    def __init__(
        self,
        graph: ModelGraph,
        modules: Mapping[str, NodeSubmodule],
        store: InProcessTensorStore,
        config: EngineConfig | None = None,
        device: str | torch.device = "cpu",
        nodes: list[str] | None = None,
        rank: int = 0,
        tp=None,
        quantization: Mapping[str, str] | None = None,
    ) -> None:
        """``tp``: a TPGroup whose rank 0 this Worker is; its AR engines shard over it.
        ``quantization``: node -> weight-only quantization overriding the config's (a placement's groups)."""
        self.rank = rank
        self.store = store
        # dtype auto is decided here, for this Worker's device (each Worker process for its own)
        self.config, self.dtype_choice = (config or EngineConfig()).for_device(device)
        hosted = list(nodes) if nodes is not None else [n.name for n in graph.nodes]
        self._engine_of: dict[str, AREngine | StatelessEngine] = {}
        self.ar_engines: dict[str, AREngine] = {}
        stateless: dict[str, NodeSubmodule] = {}
        for module_name, views in graph.modules().items():
            views = [v for v in views if v in hosted]
            if not views:
                continue
            if module_name not in modules:
                raise KeyError(f"worker {rank}: no submodule given for module {module_name!r} (nodes {views})")
            module = modules[module_name]
            if graph.node(views[0]).engine == "ar":
                if not isinstance(module, ARModule):
                    raise TypeError(f"module {module_name!r} backs AR nodes {views} but is not an ARModule")
                config = self.config
                if quantization and views[0] in quantization:
                    config = msgspec.structs.replace(config, quantization=quantization[views[0]])
                engine = AREngine(module, views, store, config, device, name=f"ar:{module_name}", tp=tp)
                self.ar_engines[module_name] = engine
                for view in views:
                    self._engine_of[view] = engine
            else:
                for view in views:
                    stateless[view] = module
        self._loop: DeviceLoop | None = None
        self.stateless = None
        if stateless:
            self.stateless = StatelessEngine(
                stateless,
                store,
                self.config.stateless_max_batch,
                device,
                dtype=getattr(torch, self.config.dtype),
                name=f"stateless:{rank}",
                max_wait_s=self.config.stateless_max_wait_ms / 1000,
                pack=self.config.pack_linears,
                priority_classes=self.config.priority_classes,
                quantization={v: (quantization or {}).get(v, self.config.quantization) for v in stateless},
                compile=self.config.compile,
            )
            for view in stateless:
                self._engine_of[view] = self.stateless

    @property
    def nodes(self) -> list[str]:
        return list(self._engine_of)

    def _engines(self) -> list[AREngine | StatelessEngine]:
        return list(self.ar_engines.values()) + ([self.stateless] if self.stateless else [])

    def start(self) -> None:
        self._loop = DeviceLoop(self._engines(), name=f"worker{self.rank}", starvation=self.config.starvation())
        self._loop.start()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        for engine in self.ar_engines.values():
            engine.close()  # ends tensor-parallel followers (no-op otherwise)

    def execute(self, msg: ExecuteNode, reply: Callable[[NodeOutput], None]) -> None:
        engine = self._engine_of.get(msg.node)
        if engine is None:
            reply(
                NodeOutput(
                    msg.call_id,
                    msg.request_id,
                    0,
                    final=True,
                    error=f"worker {self.rank} does not host node {msg.node!r}",
                )
            )
            return
        if msg.exports:
            reply = self._exporting(msg.exports, reply)
        engine.submit(msg, reply)

    def _exporting(self, exports: dict[str, str], reply: Callable[[NodeOutput], None]) -> Callable[[NodeOutput], None]:
        """Makes the call's outputs readable where they go (inline for the Conductor, a
        transport for another Worker) before the reply leaves this process."""

        def send(out: NodeOutput) -> None:
            if out.outputs:
                try:
                    out.outputs = {
                        port: self.store.export(h, exports[port]) if port in exports else h  # type: ignore[attr-defined]
                        for port, h in out.outputs.items()
                    }
                except Exception as exc:  # a full arena or a dead peer must not lose the call silently
                    log.exception("worker %d: export failed", self.rank)
                    out = NodeOutput(
                        out.call_id,
                        out.request_id,
                        out.iteration,
                        final=True,
                        error=f"worker {self.rank}: exporting outputs failed: {type(exc).__name__}: {exc}",
                    )
            reply(out)

        return send

    def export_kv(self, msg: ExportKV, reply: Callable[[KVExported], None]) -> None:
        engine = self._engine_of.get(msg.node)
        if not isinstance(engine, AREngine):
            reply(
                KVExported(
                    msg.call_id, msg.request_id, error=f"worker {self.rank} has no AR engine for node {msg.node!r}"
                )
            )
            return
        engine.export_kv(msg, reply)

    def handle(self, msg: ReleaseRequest | CloseSession | FeedInput) -> None:
        if isinstance(msg, FeedInput):
            engine = self._engine_of.get(msg.node)
            if isinstance(engine, AREngine):
                engine.feed(msg)
            else:
                log.warning("worker %d: rows for node %r, which no AR engine here serves, dropped", self.rank, msg.node)
        elif isinstance(msg, ReleaseRequest):
            for engine in self._engines():
                engine.release(msg.request_id)
        elif isinstance(msg, CloseSession):
            for engine in self.ar_engines.values():
                engine.close_session(msg.session_id)

    def stats(self) -> dict[str, dict[str, int]]:
        out = {f"ar:{name}": e.stats() for name, e in self.ar_engines.items()}
        if self.stateless:
            out["stateless"] = self.stateless.stats()
        return out

    def kv_blocks_used(self) -> int:
        return sum(e.blocks.num_used_blocks for e in self.ar_engines.values())
