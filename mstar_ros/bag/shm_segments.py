"""Fast DDS shared-memory segments left by processes that died, removed before a new participant starts.

Each Fast DDS participant maps a segment ``/dev/shm/fastdds_<16 chars>`` and holds an exclusive
``flock`` on its ``..._el`` file while it lives. A process killed (SIGKILL, a crash) leaves both
behind, and nothing in Fast DDS removes them at the next start (its ``fastdds shm clean`` tool
does, by hand). The shipped profile's segment is 32 MB (frames over 512 KB need it), so every
killed process would keep 32 MB of RAM in /dev/shm: a robot box whose node set crashes now and
then fills it. This removes a segment whose lock file no process holds -- the same test as
Fast DDS's tool -- and, so as never to race a participant that is creating its segment right now
(file made, lock not yet taken), only when the lock file is older than ``min_age_s``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from pathlib import Path

log = logging.getLogger(__name__)

_LOCK = re.compile(r"^fastdds_[0-9a-z]{16}_el$")


def _held(lock_file: Path) -> bool:
    try:
        with open(lock_file, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when closed
        return False
    except OSError:
        return True


def remove_stale_segments(shm_dir: str | Path = "/dev/shm", min_age_s: float = 30.0) -> list[str]:
    """Removes dead participants' segments (and their lock files); returns the segment names removed."""
    shm_dir = Path(shm_dir)
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    removed, freed, now = [], 0, time.time()
    for name in filter(_LOCK.match, names):
        lock, segment = shm_dir / name, shm_dir / name[:-3]
        try:
            if now - lock.stat().st_mtime < min_age_s or _held(lock):
                continue
            freed += segment.stat().st_size if segment.exists() else 0
            segment.unlink(missing_ok=True)
            lock.unlink(missing_ok=True)
        except OSError:
            continue  # another process removed it first, or it is not ours to remove
        removed.append(segment.name)
    if removed:
        log.info(
            "removed %d Fast DDS shared-memory segment(s) of processes that died (%.0f MB)", len(removed), freed / 1e6
        )
    return removed
