"""Scripts run in a fresh interpreter, for tests of who holds an OpenMP team.

A thread's intra-op width and its team are process state, so each case starts clean. With
OMP_NUM_THREADS=2 teams form on any machine, and a team of two shows as one more OS thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import os, threading, time, torch
from mstar.engine import intra_op
from mstar.engine.device_loop import device_thread, run_on_device  # imports numpy: its BLAS thread starts now
torch.set_num_threads(2)  # starts torch's pthreadpool (QNNPACK) worker now, outside the counts


def os_threads():
    return len(os.listdir("/proc/self/task"))


def settled():
    # an exited thread's team leaves just after it: wait until the count holds still
    last = os_threads()
    for _ in range(50):
        time.sleep(0.02)
        if os_threads() == last:
            return last
        last = os_threads()
    return last


def parallel_op():  # 2M elements: far above torch's grain size, so an OpenMP parallel region
    torch.ones(2_000_000).mul_(2)


def on_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]
"""


def run_fresh(body: str) -> None:
    """Runs PRELUDE + ``body`` (its asserts) in a fresh interpreter; fails with its traceback."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_NUM_THREADS"] = "2"
    run = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
