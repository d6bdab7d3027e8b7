"""One round of the device thread: which engine steps next, most urgent class first.

The device thread (mstar.engine.device_loop) runs every engine of a process. Each round
it asks every loop for the most urgent priority class (mstar.priority) of the work due
now, and steps only the engines whose due work is of that class, in their order (round
robin among equals, as before classes existed). After every step it looks again: when a
more urgent call has arrived meanwhile the round ends there, so a control call waits for
at most the one step already running (an AR step, a flow step, a frame forward, one
stateless batch), never for a whole flow loop or decode.

While more urgent work is due, less urgent engines wait; control work on a robot comes in
bursts, so voice and batch run in the gaps. A load that keeps the device busy all the time
would starve the rest, so skipped due work gets a bounded share (mstar.engine.starvation):
once it has waited long enough it takes one step, at most one such step per round, and a
control call still waits at most one step of lower-class work. An engine that reports no class (``most_urgent`` missing) counts as ``UNCLASSED``, and
with ``EngineConfig.priority_classes = False`` every engine reports ``UNCLASSED``: every
engine with due work steps each round, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from mstar.engine.starvation import StarvationGuard
from mstar.priority import UNCLASSED, Priority

log = logging.getLogger("mstar.engine")


class Steppable(Protocol):
    wake: threading.Event

    def poll(self) -> None:
        """Take the messages that arrived (never blocks)."""

    def has_work(self) -> bool:
        """Work that is due now."""

    def has_pending(self) -> bool:
        """Any work queued (it may be waiting to be batched)."""

    def step(self, limit: Priority | None = None) -> None:
        """One unit of work: an AR step, or one stateless batch; of work of class ``limit`` or more
        urgent (None: all its due work)."""

    # optional: def most_urgent(self, pending: bool = False) -> Priority | None
    #   the most urgent class of the work due now (pending=True: of any queued work); None: none
    # optional: def due_classes(self) -> set[Priority]
    #   every class it has due work of (an AR engine: each loop's most urgent); default {most_urgent}


class RoundLoop(Protocol):
    """What a round steps: a group of engines (a Worker's DeviceLoop)."""

    name: str

    def poll(self) -> None: ...

    def most_urgent(self) -> Priority | None: ...

    def step_once(self, limit: Priority | None = None) -> bool: ...

    # optional, for a bounded share (mstar.engine.starvation): ``starvation`` (a StarvationLimit or
    # None), ``due_classes() -> set[Priority]`` and ``step_class(cls) -> bool`` (one step of one engine
    # whose due work is of class ``cls``)


def engine_class(engine: Steppable, pending: bool = False) -> Priority | None:
    """``engine``'s most urgent class of due (``pending``: queued) work; None when it has none."""
    if not (engine.has_pending() if pending else engine.has_work()):
        return None
    report = getattr(engine, "most_urgent", None)
    found = report(pending=True) if pending and report is not None else report() if report is not None else None
    return UNCLASSED if found is None else Priority(found)


def engine_classes(engine: Steppable) -> set[Priority]:
    """Every class ``engine`` has due work of (empty: none): its ``due_classes`` where it reports them,
    else its most urgent class."""
    report = getattr(engine, "due_classes", None)
    if report is None or not engine.has_work():
        return {c} if (c := engine_class(engine)) is not None else set()
    return {Priority(c) for c in report()} or {UNCLASSED}


def most_urgent_of(classes: Sequence[Priority | None]) -> Priority | None:
    return min((c for c in classes if c is not None), default=None)


def engines_to_step(engines: Sequence[Steppable], limit: Priority | None) -> list[Steppable]:
    """The engines of one group that step now: those with due work of class ``limit`` or more urgent
    (every one with due work when ``limit`` is None), most urgent first; when none has due work, the
    first with queued work (so nothing idles while something waits to be batched) if its class may."""
    due = [(c, e) for e in engines if (c := engine_class(e)) is not None]
    if due:
        due.sort(key=lambda pair: pair[0])  # stable: engines of one class keep their order
        return [e for c, e in due if limit is None or c <= limit]
    for engine in engines:
        c = engine_class(engine, pending=True)
        if c is not None:
            return [engine] if limit is None or c <= limit else []
    return []


def next_of_class(engines: Sequence[Steppable], cls: Priority, start: int) -> int | None:
    """The index of the first engine from ``start`` on (wrapping round) with due work of class
    ``cls``; None when none has. Engines of one class so take skipped steps in turn."""
    for offset in range(len(engines)):
        i = (start + offset) % len(engines)
        if cls in engine_classes(engines[i]):
            return i
    return None


def poll_all(loops: Sequence[RoundLoop]) -> Priority | None:
    """Every loop takes its messages; returns the most urgent class due anywhere."""
    for loop in loops:
        try:
            loop.poll()
        except Exception:  # an inbox that fails must not stop the others
            log.exception("%s: poll failed", loop.name)
    return most_urgent_of([_safe_class(loop) for loop in loops])


def _safe_class(loop: RoundLoop) -> Priority | None:
    try:
        return loop.most_urgent()
    except Exception:
        log.exception("%s: most_urgent failed", loop.name)
        return UNCLASSED


def step_round(
    loops: Sequence[RoundLoop], after_step: Callable[[], None], guard: StarvationGuard | None = None
) -> bool:
    """One round over ``loops``; ``after_step`` runs after each loop's step. Returns whether any stepped.
    With a ``guard``, skipped due work that has waited past its loop's limit first takes one step."""
    limit = poll_all(loops)
    busy, served = False, None
    if guard is not None and limit is not None:
        aged = guard.pick(loops, limit)
        if aged is not None and _step_skipped(*aged, after_step, guard):
            busy, served = True, aged[1]
            limit = poll_all(loops)  # what arrived during that step decides the rest of the round
    for loop in loops:
        try:
            stepped = loop.step_once(limit)
        except Exception:  # the device thread must never die: every caller would hang
            log.exception("%s: device loop failed", loop.name)
            stepped = False
        finally:
            after_step()
        busy |= stepped
        if stepped:  # queued work stepped with nothing due: of any class, so count it as the least urgent
            ran = limit if limit is not None else max(Priority)
            served = ran if served is None else max(served, ran)
        if stepped and limit is not None:
            newer = poll_all(loops)
            if newer is not None and newer < limit:
                break  # a more urgent call arrived during that step: the next round serves it
    if guard is not None:
        guard.round_ended(served)
    return busy


def _step_skipped(loop: RoundLoop, cls: Priority, after_step: Callable[[], None], guard: StarvationGuard) -> bool:
    """One step of ``loop``'s skipped due work of class ``cls``; tells the guard what it cost."""
    started = guard.clock()
    try:
        stepped = bool(loop.step_class(cls))  # type: ignore[attr-defined]
    except Exception:  # the device thread must never die
        log.exception("%s: device loop failed", loop.name)
        stepped = False
    finally:
        after_step()
    if stepped:
        guard.stepped(loop, cls, guard.clock() - started)
    return stepped
