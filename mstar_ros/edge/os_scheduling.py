"""A process group's CPU scheduling policy (``scheduling:`` in the edge config), set by the process itself.

- ``normal``: the kernel's default policy (SCHED_OTHER); a process started under another policy is put
  back on it.
- ``idle``: Linux SCHED_IDLE: the fair scheduler's lowest weight (3 against a normal thread's 1024), so
  the process gets almost nothing while ``normal`` threads want the cores, and a waking normal thread
  preempts it at once. For a batch group (image generation): within one process a control call waits
  for the lower-class step already running (a BAGEL flow step is seconds on a CPU); in an idle process
  no step of it holds the others' cores. Not strict priority: it still shares caches, memory
  bandwidth and a core's other hyperthread with them, and the kernel first divides CPU time between
  cgroups, so run the groups in one cgroup (as ``mstar-ros launch edge`` and ``ros2 launch`` do),
  not in separate containers or systemd units.

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
        if current_scheduling() != "normal":
            try:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            except PermissionError:
                raise OSError(
                    f"scheduling: normal: this process was started under {current_scheduling()} and may not "
                    "leave it (it needs CAP_SYS_NICE)"
                ) from None
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
