"""The device thread: one thread per process runs every engine step and all heavy torch work.

A device (a CPU socket, a GPU) does one thing at a time: engines on separate
threads only fight over its cores (measured on 2 cores: a decode layer went from
0.5 ms to 3-24 ms when an encoder ran beside it). And on CPU two threads that both
run parallel torch ops keep two OpenMP teams, which slows both (a decode step:
7 ms on one thread, 10.5-14 ms once another thread had run parallel ops). So
engines take turns on one thread, and loading weights or running a reference model
goes through ``run_on_device`` to the same thread. Torch work on every other thread
(ROS callbacks, request building, a bench's loads) runs on one intra-op thread: the
device thread claims the process's width when it starts, and the thread that started
it is confined to one (``mstar.engine.intra_op``: a second team made the pi0.5 forward
1.45-1.7x slower, for as long as the thread that built it lived).

Engines take turns by priority class (mstar.engine.device_round): each round steps the
engines whose due work is most urgent, and a round ends early when a more urgent call
arrives, so a control call waits at most one step of a batch engine. Due work that more urgent
work keeps skipping still gets a bounded share of the device (mstar.engine.starvation; each Worker's
``EngineConfig.starvation_wait_ms`` and ``starved_share``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from mstar.engine import intra_op
from mstar.engine.device_round import (
    Steppable,
    engine_class,
    engine_classes,
    engines_to_step,
    most_urgent_of,
    next_of_class,
    step_round,
)
from mstar.engine.starvation import DEFAULT_LIMIT, StarvationGuard, StarvationLimit
from mstar.engine.step_trace import StepTrace, clock
from mstar.priority import Priority

log = logging.getLogger("mstar.engine")
T = TypeVar("T")


__all__ = ["DeviceLoop", "DeviceThread", "Steppable", "device_thread", "run_on_device"]


class DeviceThread:
    def __init__(self) -> None:
        self.wake = threading.Event()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._loops: list[DeviceLoop] = []
        self._guard = StarvationGuard()  # device thread only
        self._lock = threading.Lock()
        self._deferred: list[Callable[[], None]] = []
        self._in_call = False  # inside run_on_device work: nothing to coalesce
        self.threads = 0  # its intra-op width, claimed when it starts
        self.trace: StepTrace | None = None  # a bench's record of every engine step (off: None)
        claimed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(claimed,), name="mstar-device", daemon=True)
        self._thread.start()
        claimed.wait()  # first: confining this thread changes the default a new thread starts from
        intra_op.confine_to_one_thread()

    def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Runs ``fn`` on the device thread and returns its result (inline if already on it)."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args, kwargs))
        self.wake.set()
        return future.result()

    def attach(self, loop: DeviceLoop) -> None:
        with self._lock:
            self._loops = self._loops + [loop]
        self.wake.set()

    def detach(self, loop: DeviceLoop) -> None:
        with self._lock:
            self._loops = [other for other in self._loops if other is not loop]
        self.call(lambda: None)  # returns once the thread is past any step of that loop

    def _run(self, claimed: threading.Event) -> None:
        try:
            self.threads = intra_op.claim_team()
        finally:
            claimed.set()
        while True:
            self.wake.clear()
            self._run_calls()
            busy = step_round(self._loops, self._flush_after_step, self._guard)
            if not busy:
                self.wake.wait(timeout=0.5)

    def after_step(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` when the current step ends (now, off the device thread or between steps).
        A step's outputs then wake their consumer once: every wake-up of an event loop from here
        is a GIL hand-over that stalls the step (measured: 6 per decode step, 68 us each)."""
        if threading.current_thread() is not self._thread or self._in_call:
            fn()
        elif fn not in self._deferred:
            self._deferred.append(fn)

    def _flush_after_step(self) -> None:
        deferred, self._deferred = self._deferred, []
        for fn in deferred:
            try:
                fn()
            except Exception:
                log.exception("after-step callback failed")

    def _run_calls(self) -> None:
        while True:
            try:
                future, fn, args, kwargs = self._calls.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                self._in_call = True
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)
                finally:
                    self._in_call = False


_device_thread: DeviceThread | None = None
_create_lock = threading.Lock()


def device_thread() -> DeviceThread:
    global _device_thread
    with _create_lock:
        if _device_thread is None:
            _device_thread = DeviceThread()
        return _device_thread


def run_on_device(fn: Callable[..., T], *args, **kwargs) -> T:
    """Heavy torch work (loading, reference models) on the same thread as the engines."""
    return device_thread().call(fn, *args, **kwargs)


class DeviceLoop:
    """A Worker's engines, stepped in turn on the device thread.

    ``starvation``: how long its due work waits while more urgent work of other loops keeps the
    device busy before it takes one step anyway, and its largest share then (None: strict priority)."""

    def __init__(
        self, engines: Sequence[Steppable], name: str, starvation: StarvationLimit | None = DEFAULT_LIMIT
    ) -> None:
        self.engines = list(engines)
        self.name = name
        self.starvation = starvation
        self._next_skipped = 0  # engines of one class take skipped steps in turn
        self._thread = device_thread()
        for engine in self.engines:
            engine.wake = self._thread.wake  # any submit wakes the device thread

    def start(self) -> None:
        self._thread.attach(self)

    def stop(self) -> None:
        self._thread.detach(self)

    def poll(self) -> None:
        for engine in self.engines:
            engine.poll()

    def most_urgent(self) -> Priority | None:
        """The most urgent class of the work due in any of its engines (None: nothing is due)."""
        return most_urgent_of([engine_class(e) for e in self.engines])

    def due_classes(self) -> set[Priority]:
        """Every class its engines have due work of (an AR engine's: each loop's)."""
        return {c for e in self.engines for c in engine_classes(e)}

    def step_class(self, cls: Priority) -> bool:
        """One step of one engine whose due work is of class ``cls`` (in turn among such engines)."""
        self.poll()
        i = next_of_class(self.engines, cls, self._next_skipped)
        if i is None:
            return False
        self._next_skipped = i + 1
        self._step(self.engines[i], cls)
        return True

    def step_once(self, limit: Priority | None = None) -> bool:
        """Steps its engines with due work of class ``limit`` or more urgent (None: every one due);
        when nothing is due, the first with queued work, so nothing idles while it waits to be batched."""
        self.poll()
        busy = engines_to_step(self.engines, limit)
        for i, engine in enumerate(busy):
            if i and limit is not None:
                self.poll()
                newer = self.most_urgent()
                if newer is not None and newer < limit:
                    break  # a more urgent call arrived: its step comes before this group's next
            self._step(engine, limit)
        return bool(busy)

    def _step(self, engine: Steppable, limit: Priority | None) -> None:
        trace = self._thread.trace
        if trace is not None:  # the class it steps: the round's limit (None: its own most urgent)
            cls, start = (limit if limit is not None else engine_class(engine)), clock()
        try:
            engine.step(limit)
        except Exception:  # engines report their own failures; the loop must survive
            log.exception("%s: engine step raised", self.name)
        if trace is not None:
            trace.add(start, clock(), self.name, engine, cls)
