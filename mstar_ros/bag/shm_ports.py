"""Fast DDS shared-memory ports this process used, removed at exit once no live process uses them.

How Fast DDS (3.x, ``SharedMemGlobal``) keeps its ports in /dev/shm: port N is the segment
``fastdds_portN``, guarded by the named mutex ``fastdds_portN_mutex`` (the POSIX semaphore file
``sem.fastdds_portN_mutex``) that every participant takes before it opens or creates the port. Its
listener holds an exclusive ``flock`` on ``fastdds_portN_el`` (a shared one on ``..._sl`` for a
multicast port); every participant that writes into it maps the segment too. A reference count *inside*
the segment says how many have it open, and the last one to close it removes the segment and the
mutex. A process that was killed never decrements that count, so from then on nobody's clean exit
removes the port: after one crash, every clean SIGINT stop left its ports and semaphores behind.

So at exit, for each port this process had mapped, with the port's mutex held (as Fast DDS holds it to
open or remove a port: nobody can open the port meanwhile), the port is removed -- segment, unlocked
lock files, mutex -- only when no live process maps it and nobody holds its lock files. A port another
live process still uses is never touched. Processes whose memory maps we may not read (another user's)
are not seen; they cannot open our ports either (Fast DDS opens them read-write, and they are 0644),
root's processes excepted.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_PORT = re.compile(r"/dev/shm/(fastdds_port\d+)$")
MUTEX_WAIT_S = 0.5  # Fast DDS holds a port's mutex only while it opens or closes the port


def ports_in_use(pid: int | str = "self") -> set[str]:
    """The Fast DDS ports (``fastdds_portN``) that process ``pid`` maps now (empty if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {m.group(1) for line in maps if (m := _PORT.search(line.rstrip("\n")))}
    except OSError:
        return set()


def _mapped_by_a_live_process(port: str) -> bool:
    return any(entry.name.isdigit() and port in ports_in_use(entry.name) for entry in os.scandir("/proc"))


def _lock_held(lock_file: Path) -> bool:
    """True when a process holds an flock on ``lock_file`` (taking it for an instant tells)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: as if held
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the lock, if we took it


def _remove_if_unused(port: str) -> bool:
    import posix_ipc

    try:
        mutex = posix_ipc.Semaphore(f"/{port}_mutex")  # open only: Fast DDS made it with the port
    except posix_ipc.ExistentialError:
        return False
    try:
        mutex.acquire(MUTEX_WAIT_S)
    except posix_ipc.BusyError:
        mutex.close()
        return False  # someone is opening or closing the port right now: theirs
    removed = False
    try:
        segment, locks = SHM_DIR / port, [SHM_DIR / f"{port}_el", SHM_DIR / f"{port}_sl"]
        if segment.exists() and not any(map(_lock_held, locks)) and not _mapped_by_a_live_process(port):
            for path in (segment, *locks):
                path.unlink(missing_ok=True)
            removed = True
    finally:
        mutex.release()
        if removed:
            mutex.unlink()  # as Fast DDS removes a port's mutex with the port, while holding it
        mutex.close()
    return removed


def remove_unused_ports(ports: Iterable[str]) -> list[str]:
    """Removes each of ``ports`` that no live process uses (see above); returns the ports removed."""
    removed = []
    ports = sorted(ports)
    try:
        import posix_ipc  # noqa: F401  (the pip `ros` extra has it; a colcon or /opt/ros install may not)
    except ImportError:
        if ports:
            log.info(
                "posix_ipc is not installed (pip install posix-ipc): Fast DDS's %d port file(s) of this "
                "process are left for Fast DDS to clean",
                len(ports),
            )
        return removed
    for port in ports:
        try:
            if _remove_if_unused(port):
                removed.append(port)
        except OSError as exc:  # not ours to remove after all (permissions), or gone meanwhile
            log.debug("Fast DDS port %s left: %s", port, exc)
    if removed:
        log.debug("removed %d Fast DDS shared-memory port(s) no process uses: %s", len(removed), ", ".join(removed))
    return removed


def shut_down_removing_ports(shutdown: Callable[[], object]) -> list[str]:
    """Calls ``shutdown`` (which destroys this process's nodes and DDS participants), then removes the ports
    they used that no live process uses any more. Returns the ports removed. Call it before any node is
    destroyed (the last one's destruction already unmaps the ports), and handle SIGINT in the process:
    rclpy's own handler shuts the participants down at once, before their ports can be seen."""
    ports = ports_in_use()  # while our participants still map them
    shutdown()
    return remove_unused_ports(ports)
