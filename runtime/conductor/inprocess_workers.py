"""The embedded worker set: one Worker in the Conductor's process runs every node.

Tensors are handed over in memory: the Worker reads the Conductor's store itself,
so an input needs no export and the store's count is everything held.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import torch

from mstar.conductor.worker_set import WorkerLink, WorkerSet
from mstar.conductor.worker_status import WorkerStatus
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.graph.model_graph import ModelGraph
from mstar.graph.node import NodeSubmodule
from mstar.transport.handle import TensorHandle
from mstar.transport.inprocess import InProcessTensorStore
from mstar.worker.worker import Worker


class InProcessWorkers(WorkerSet):
    def __init__(
        self,
        graph: ModelGraph,
        modules: Mapping[str, NodeSubmodule],
        config: EngineConfig | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(InProcessTensorStore(), placement=None)
        # built on the device thread: dtype casts and KV allocation are heavy torch work
        self.local_worker = run_on_device(Worker, graph, modules, self.store, config, device)
        missing = [n.name for n in graph.nodes if n.name not in self.local_worker.nodes]
        if missing:
            raise ValueError(f"nodes {missing} are placed on no worker")
        self._running = False

    @property
    def workers(self) -> list[WorkerLink]:
        return [self.local_worker]

    async def worker(self, rank: int) -> WorkerLink:
        if rank != 0:
            raise KeyError(f"no worker rank {rank}: an embedded Conductor has rank 0 only")
        return self.local_worker

    def host_of(self, rank: int) -> str:
        return socket.gethostname()

    async def start(self) -> None:
        self.local_worker.start()
        self._running = True

    async def stop(self) -> None:
        self.local_worker.stop()
        self._running = False

    def put_input(self, tensor: torch.Tensor, owner: str) -> TensorHandle:
        return self.store.put(tensor, owner=owner)

    def worker_status(self) -> list[WorkerStatus]:
        """The one Worker is rank 0 in this very process (it cannot die on its own)."""
        worker = self.local_worker
        return [
            WorkerStatus(
                rank=0,
                state="alive" if self._running else "dead",
                pid=os.getpid(),
                host=socket.gethostname(),
                nodes=tuple(sorted(worker.nodes)),
                restarts=0,
                last_death=None,
                heartbeat_age_s=None,
                dtype=worker.dtype_choice.dtype,
                dtype_reason=worker.dtype_choice.describe(),
            )
        ]

    async def refresh(self) -> None:
        return None  # the Worker's counters are read directly

    def tensors_held(self) -> int:
        return len(self.store)  # the Worker keeps its tensors in this same store
