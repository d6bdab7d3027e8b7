"""What a process's threads are doing, read from /proc: for the thread-slowdown check and its repro.

An OpenMP team shows as OS threads (a team of N adds N - 1), and a team whose barriers
sleep instead of spinning shows as voluntary context switches: both are counts, steadier on
a shared machine than the timings they explain.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def voluntary_switches() -> int:
    """Voluntary context switches of every thread of this process so far (each futex sleep is one)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))
        except (FileNotFoundError, ProcessLookupError, StopIteration):  # the thread exited meanwhile
            pass
    return total


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settled_threads(timeout_s: float = 1.0) -> int:
    """OS threads once an exited thread's team is gone (its threads exit just after it)."""
    deadline, last = time.monotonic() + timeout_s, os_threads()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = os_threads()
        if now == last:
            return now
        last = now
    return last


class HelperThread:
    """A thread that runs ``work`` and then stays alive (as ROS executor threads and a bench's main
    thread do) until :meth:`close`. ``width`` is its torch intra-op thread count after ``work``."""

    def __init__(
        self,
        work: Callable[[], object],
        *,
        before: Callable[[], object] | None = None,
        after: Callable[[], object] | None = None,
    ) -> None:
        import torch

        self.width = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        ready = threading.Event()

        def run() -> None:
            try:
                for step in (before, work, after):
                    if step is not None:
                        step()
                self.width = torch.get_num_threads()
            except BaseException as exc:  # reported by the caller: a helper must not hang it
                self.error = exc
            finally:
                ready.set()
            self._stop.wait()

        self._thread = threading.Thread(target=run, name="thread-probe-helper", daemon=True)
        self._thread.start()
        ready.wait()
        if self.error is not None:
            self.close()
            raise self.error

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
