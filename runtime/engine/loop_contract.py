"""The one contract every loop of the AR engine keeps (token, flow and frame loops).

The engine holds one loop per LoopMode over a shared EngineCore: it hands each call to the
loop of its mode, steps every loop that has work, and passes releases, closed sessions and
a failed step's error to them, without knowing what kind of loop it talks to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from mstar.engine.engine_inbox import Reply
from mstar.engine.messages import ExecuteNode
from mstar.priority import UNCLASSED, Priority


class CallRefused(Exception):
    """A call this engine or loop cannot run: the reply's error is the message alone (no type,
    no traceback in the log), as for any other request the caller got wrong."""


class EngineLoop(ABC):
    """One kind of engine-resident loop. Every method runs on the device thread."""

    @abstractmethod
    def start(self, msg: ExecuteNode, reply: Reply) -> None:
        """Takes a call: checks it (CallRefused, or any exception, fails it) and queues its work."""

    @abstractmethod
    def has_work(self) -> bool:
        """Whether a ``step`` now may compute something."""

    @abstractmethod
    def step(self, limit: Priority | None = None) -> int:
        """One batched step over the loop's calls; returns how many it advanced (0: nothing ran).
        ``limit``: the round's class; a loop may leave work less urgent than it for later (None:
        everything due steps). Called on every engine step whose class its most urgent work is
        within (a loop with nothing due returns 0 at once); it may raise, and the engine then
        calls ``fail_all``."""

    def most_urgent(self) -> Priority | None:
        """The most urgent class (mstar.priority) of the work ``step`` may compute now; None when
        there is none. The device thread steps the engine with the most urgent work first."""
        return UNCLASSED if self.has_work() else None

    @abstractmethod
    def fail_all(self, error: Exception) -> None:
        """``step`` raised ``error``: the calls it was stepping fail with a reply that names it,
        and what they had half-written is undone."""

    @abstractmethod
    def release(self, request_id: str) -> None:
        """The Conductor let go of ``request_id``: its calls stop; a session keeps what it computed."""

    @abstractmethod
    def close_session(self, session_id: str) -> None:
        """The session ended: its state goes, and a call still in flight fails."""

    @abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters for the engine's stats (its keys are part of the diagnostics)."""
