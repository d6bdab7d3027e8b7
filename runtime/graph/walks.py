"""The Walk primitives: Sequential, Parallel, Loop / DynamicLoop, and AwaitInput (streaming edges live in edges.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mstar.graph.request_state import RequestState


class WalkStep:
    """A node of a Walk tree."""

    def children(self) -> tuple[WalkStep, ...]:
        return ()

    def iter_steps(self) -> Iterator[WalkStep]:
        yield self
        for child in self.children():
            yield from child.iter_steps()

    def node_names(self) -> list[str]:
        return [s.node for s in self.iter_steps() if isinstance(s, Call)]


StepLike = WalkStep | str


def as_step(step: StepLike) -> WalkStep:
    if isinstance(step, str):
        return Call(step)
    if not isinstance(step, WalkStep):
        raise TypeError(f"a walk step must be a node name or a WalkStep, got {type(step).__name__}")
    return step


@dataclass(frozen=True)
class Call(WalkStep):
    """Run one node once, on the current values of its input edges."""

    node: str


@dataclass(frozen=True)
class AwaitInput(WalkStep):
    """Wait until the streamed graph input ``name`` has ended and every chunk cut from it, and from the
    streams its consumers feed, has run: what the rest of the Walk reads is then whole (a spoken turn's
    audio, streamed in as it is said, is heard before the answer starts)."""

    name: str


class Sequential(WalkStep):
    def __init__(self, *steps: StepLike) -> None:
        if not steps:
            raise ValueError("Sequential needs at least one step")
        self.steps = tuple(as_step(s) for s in steps)

    def children(self) -> tuple[WalkStep, ...]:
        return self.steps

    def __repr__(self) -> str:
        return f"Sequential{self.steps!r}"


class Parallel(WalkStep):
    """Branches run concurrently (e.g. CFG fan-out over LLM views); all must finish."""

    def __init__(self, *branches: StepLike) -> None:
        if len(branches) < 2:
            raise ValueError("Parallel needs at least two branches")
        self.branches = tuple(as_step(b) for b in branches)

    def children(self) -> tuple[WalkStep, ...]:
        return self.branches

    def __repr__(self) -> str:
        return f"Parallel{self.branches!r}"


@dataclass(frozen=True)
class StopOnValues:
    """Stop a Loop when the value produced at ``edge`` ("node.port") is one of ``values``.

    The stopping value ends the loop and is not passed on along the edge's consumers
    (an end-of-speech token is not audio). Serializable, so an engine can check it
    next to the device.
    """

    edge: str
    values: tuple[int, ...]


@dataclass(frozen=True)
class StopWhen:
    """Stop a Loop when ``predicate(state)`` is true after an iteration."""

    predicate: Callable[[RequestState], bool]
    name: str = "predicate"


StopCondition = StopOnValues | StopWhen


class Loop(WalkStep):
    """Repeat ``body`` up to ``max_iters`` times and/or until ``stop`` fires.

    State a Loop's nodes keep (KV caches) persists across its iterations.
    """

    def __init__(self, body: StepLike, max_iters: int | None = None, stop: StopCondition | None = None) -> None:
        if max_iters is None and stop is None:
            raise ValueError("Loop needs max_iters, a stop condition, or both")
        if max_iters is not None and max_iters < 1:
            raise ValueError(f"Loop max_iters must be >= 1, got {max_iters}")
        self.body = as_step(body)
        self.max_iters = max_iters
        self.stop = stop

    def children(self) -> tuple[WalkStep, ...]:
        return (self.body,)

    def trip_limit(self, state: RequestState) -> int | None:
        return self.max_iters

    def __repr__(self) -> str:
        return f"Loop({self.body!r}, max_iters={self.max_iters}, stop={self.stop!r})"


class DynamicLoop(Loop):
    """A Loop whose trip count is decided per request at run time (e.g. a requested
    number of flow steps or a rollout horizon)."""

    def __init__(
        self, body: StepLike, trip_count: Callable[[RequestState], int], stop: StopCondition | None = None
    ) -> None:
        super().__init__(body, max_iters=1 << 30, stop=stop)
        self.trip_count = trip_count

    def trip_limit(self, state: RequestState) -> int | None:
        count = int(self.trip_count(state))
        if count < 0:
            raise ValueError(f"DynamicLoop trip count must be >= 0, got {count}")
        return count

    def __repr__(self) -> str:
        return f"DynamicLoop({self.body!r}, stop={self.stop!r})"
