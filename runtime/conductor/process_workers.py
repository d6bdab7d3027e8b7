"""The distributed worker set: one Worker process per rank, started and watched by a WorkerPool.

Workers in other processes cannot read the Conductor's memory: inputs go inline in
the call message, and each Worker reports its own tensors and counters when asked.
"""

from __future__ import annotations

import asyncio

import torch

from mstar.conductor.worker_pool import WorkerPool
from mstar.conductor.worker_set import WorkerLink, WorkerSet
from mstar.conductor.worker_status import WorkerStatus
from mstar.transport.exchange import TensorExchange
from mstar.transport.handle import TensorHandle


class ProcessWorkers(WorkerSet):
    pool: WorkerPool

    def __init__(self, pool: WorkerPool) -> None:
        # reads the inline values Workers send back (and, as any reader of the pool, holds its token)
        self.exchange = TensorExchange("conductor", secret=pool.token.encode())
        super().__init__(self.exchange, pool.placement, pool)

    @property
    def workers(self) -> list[WorkerLink]:
        return list(self.pool.workers.values())

    async def worker(self, rank: int) -> WorkerLink:
        worker = self.pool.workers.get(rank)
        if worker is not None and worker.alive:
            return worker
        return await self.pool.wait_ready(rank, self.pool.setup_timeout)  # it is being restarted

    def host_of(self, rank: int) -> str:
        worker = self.pool.workers.get(rank)
        return worker.host if worker is not None else "localhost"

    async def start(self) -> None:
        try:
            await self.pool.start()
        except BaseException:
            await self.pool.stop()  # no Worker outlives a failed start
            raise

    async def stop(self) -> None:
        await self.pool.stop()
        self.exchange.close()

    def put_input(self, tensor: torch.Tensor, owner: str) -> TensorHandle:
        return self.exchange.export(self.exchange.put(tensor, owner=owner), "inline")

    def worker_status(self) -> list[WorkerStatus]:
        return self.pool.worker_status()

    async def refresh(self) -> None:
        # a Worker that does not answer keeps its last counters (the pool's heartbeat acts)
        await asyncio.gather(
            *(w.refresh_stats() for w in self.pool.workers.values() if w.alive), return_exceptions=True
        )

    def tensors_held(self) -> int:
        return len(self.exchange) + sum(w.tensors_held() for w in self.pool.workers.values())
