"""What the Conductor needs from its Workers, wherever they run.

A Conductor holds one ``WorkerSet``, chosen when it is built: ``InProcessWorkers``
(one Worker in this process, tensors handed over in memory) or ``ProcessWorkers``
(one Worker process per rank of a placement, supervised by a ``WorkerPool``). The
Conductor's logic is the same for both; only these operations differ.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from mstar.conductor.worker_status import WorkerStatus
from mstar.engine.messages import (
    CloseSession,
    ExecuteNode,
    ExportKV,
    FeedInput,
    KVExported,
    NodeOutput,
    ReleaseRequest,
    TensorHandle,
)
from mstar.placement.resolve import ResolvedPlacement
from mstar.transport.inprocess import InProcessTensorStore

if TYPE_CHECKING:  # only ProcessWorkers has a pool: the contract does not load it
    from mstar.conductor.worker_pool import WorkerPool


class WorkerLink(Protocol):
    """One Worker as the Conductor reaches it: ``Worker`` in this process, ``RemoteWorker`` over its connection."""

    rank: int

    def execute(self, msg: ExecuteNode, reply: Callable[[NodeOutput], None]) -> None: ...

    def handle(self, msg: ReleaseRequest | CloseSession | FeedInput) -> None: ...

    def export_kv(self, msg: ExportKV, reply: Callable[[KVExported], None]) -> None: ...

    def stats(self) -> dict[str, dict[str, int]]: ...

    def kv_blocks_used(self) -> int: ...


class WorkerSet(ABC):
    """Every Worker of one Conductor, and the tensor store the Conductor shares with them."""

    def __init__(
        self, store: InProcessTensorStore, placement: ResolvedPlacement | None, pool: WorkerPool | None = None
    ) -> None:
        self.store = store  # the Conductor's tensors: request inputs, and the values Workers send back
        self.placement = placement  # which rank runs which node; None: one Worker runs them all
        self.pool = pool  # the processes behind the set, for callers that reach them (tests, benchmarks)

    @property
    @abstractmethod
    def workers(self) -> list[WorkerLink]:
        """The Workers connected now (a rank being restarted may be missing)."""

    @abstractmethod
    async def worker(self, rank: int) -> WorkerLink:
        """The rank's live Worker; waits while it is being restarted."""

    @abstractmethod
    def host_of(self, rank: int) -> str:
        """Where the rank runs (the Router picks a transport by it)."""

    @abstractmethod
    async def start(self) -> None:
        """Brings every Worker up; when that fails, none is left running."""

    @abstractmethod
    async def stop(self) -> None:
        """Stops every Worker and frees what the store holds outside this process."""

    @abstractmethod
    def put_input(self, tensor: torch.Tensor, owner: str) -> TensorHandle:
        """Stores a tensor the Conductor hands to Workers; returns a handle they can read."""

    @abstractmethod
    def worker_status(self) -> list[WorkerStatus]:
        """Each rank: alive / starting / restarting / dead, its process, restarts, heartbeat age."""

    @abstractmethod
    async def refresh(self) -> None:
        """Fetches the Workers' counters where they are not read directly."""

    @abstractmethod
    def tensors_held(self) -> int:
        """Tensors still held by the Conductor's store and by the Workers."""
