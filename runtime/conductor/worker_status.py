"""What the Conductor knows of each Worker process, for health reports (e.g. /diagnostics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# starting: its first process is not ready yet; alive: ready and connected; restarting: its
# process was lost and another is being started; dead: lost for good (failed setup, no restart,
# or the pool is stopping)
WorkerState = Literal["starting", "alive", "restarting", "dead"]


@dataclass(frozen=True)
class WorkerStatus:
    rank: int
    state: WorkerState
    pid: int | None  # the rank's current (or last) process
    host: str | None  # where it runs, as it said in its Hello
    nodes: tuple[str, ...]
    restarts: int  # processes started for this rank to replace a lost one
    last_death: str | None  # why its last lost process went, e.g. "died (killed by SIGKILL)"
    heartbeat_age_s: float | None  # since its last heartbeat reply; None when no process answers
    dtype: str | None = None  # what its engines run, once it said (dtype auto is decided per Worker)
    dtype_reason: str | None = None

    @property
    def up(self) -> bool:
        return self.state == "alive"


class WorkerSetupError(RuntimeError):
    """A Worker process could not build its part of the model; ``error`` is its own one-line account."""

    def __init__(self, rank: int, error: str) -> None:
        super().__init__(f"worker rank {rank} failed to start: {error}")
        self.rank, self.error = rank, error
