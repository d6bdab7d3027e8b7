"""One OpenMP team per process, the device thread's; other threads run torch ops on one thread (docs/performance.md)."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading

import torch

log = logging.getLogger("mstar.engine")

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t; libgomp treats soft and hard alike: the team's threads exit
_model_threads: int | None = None
_one_by_default = False  # once a thread was confined, threads started later take one thread
_lock = threading.Lock()


def claim_team(width: int | None = None) -> int:
    """The calling thread runs torch ops on ``width`` threads (default: the width the device
    thread claimed, else the process default: ``torch.set_num_threads`` before, OMP_NUM_THREADS,
    the cores). Call it first thing on a thread that runs model work."""
    global _model_threads
    with _lock:
        if width is None:
            width = _model_threads or torch.get_num_threads()  # a thread's first call reads the default
        torch.set_num_threads(width)
        if _model_threads is None:
            _model_threads = width
        if _one_by_default:  # set_num_threads also moved the default threads start from: put it back
            helper = threading.Thread(target=torch.set_num_threads, args=(1,), name="mstar-intra-op-default")
            helper.start()
            helper.join()
    return width


def model_threads() -> int:
    """The intra-op width model work runs with (read it here: other threads report 1)."""
    return _model_threads or torch.get_num_threads()


def confine_to_one_thread() -> bool:
    """The calling thread (and every thread started after it) runs torch ops on one thread,
    and its OpenMP team, if it had one, is released (see :func:`release_team`)."""
    global _one_by_default
    with _lock:
        torch.set_num_threads(1)
        _one_by_default = True
    return release_team()


def release_team() -> bool:
    """Hands back the calling thread's OpenMP team, if any (libgomp joins its threads). True when
    the runtime did (or the thread had none); False when it cannot: not libgomp, or inside a
    parallel region."""
    pause = _omp_pause_resource_all()
    if pause is None:
        return False
    return pause(_OMP_PAUSE_SOFT) == 0


@functools.lru_cache(maxsize=1)
def _omp_pause_resource_all():
    """libgomp's ``omp_pause_resource_all``, found at run time, or None. Only libgomp (torch's Linux
    wheels, CPU and CUDA alike): its soft pause joins the calling thread's team and no other
    (read in its team.c); other runtimes pause every thread of the process."""
    path = libgomp_path()
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).omp_pause_resource_all  # already loaded: the same handle, no second copy
    except (OSError, AttributeError) as exc:  # older than OpenMP 5.0
        log.info("%s cannot release thread teams (%s)", path, exc)
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def libgomp_path() -> str | None:
    """The libgomp mapped into this process (torch's own copy first), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {parts[5].strip() for parts in (line.split(maxsplit=5) for line in maps) if len(parts) == 6}
    except OSError:  # not Linux
        return None
    found = sorted(p for p in paths if os.path.basename(p).startswith("libgomp") and ".so" in p)
    torch_dir = os.path.dirname(torch.__file__)
    found.sort(key=lambda p: not p.startswith(torch_dir))  # a second libgomp (another extension's) is not torch's
    return found[0] if found else None
