"""A process group's CPU scheduling policy (``scheduling:`` in the edge config), set by the process itself.

- ``normal``: the kernel's default policy (SCHED_OTHER).
- ``idle``: Linux SCHED_IDLE: the process runs only on the cycles the ``normal`` processes leave, and
  the kernel takes a core back from it at once when a normal thread wakes. For a batch group (image
  generation): within one process a control call waits for the lower-class step already running
  (a BAGEL flow step is seconds on a CPU); in an idle process no step of it holds the others' cores.

Set before torch is imported: every thread started afterwards (the OpenMP team, the device thread)
inherits it. Standard library only.
"""

from __future__ import annotations

import os

POLICIES = ("normal", "idle")


def apply_scheduling(policy: str) -> None:
    """Puts the calling thread, and every thread it starts afterwards, under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"scheduling must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "normal":
        return
    if not hasattr(os, "SCHED_IDLE"):
        raise OSError("scheduling: idle needs Linux's SCHED_IDLE, which this system has not")
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def current_scheduling() -> str:
    """The calling thread's policy, as the edge config names it ("other:N" for a policy it has no name for)."""
    found = os.sched_getscheduler(0)
    if found == getattr(os, "SCHED_IDLE", None):
        return "idle"
    return "normal" if found == os.SCHED_OTHER else f"other:{found}"
