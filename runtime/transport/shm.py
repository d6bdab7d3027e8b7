"""POSIX shared-memory segments as mmaps of /dev/shm files, named by process tag.

Why not ``multiprocessing.shared_memory``: on Python < 3.13 every attach registers the
segment with the resource_tracker, which then unlinks (or warns about) segments that
belong to another process when this one exits. A plain file in /dev/shm plus mmap is
the same kernel object (what shm_open makes) with no tracker involved: the creator
unlinks on close(), and a supervisor unlinks what a SIGKILLed process left behind with
:func:`unlink_segments` (names start with :func:`segment_prefix` of the process tag).
"""

from __future__ import annotations

import mmap
import os
import re
import threading

import torch

from mstar.transport.codec import memcpy

SHM_DIR = "/dev/shm"
_TAG = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# MAP_POPULATE maps every page up front: no page faults inside timed copies later.
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def check_tag(tag: str) -> str:
    if not _TAG.match(tag):
        raise ValueError(f"process tag {tag!r}: use 1-64 of A-Z a-z 0-9 _ - (it names shared-memory segments)")
    return tag


def segment_prefix(tag: str) -> str:
    """Every segment of the process tagged ``tag`` starts with this (the '.' cannot occur in a tag)."""
    return f"mstar-{check_tag(tag)}."


def segments_with_prefix(prefix: str) -> list[str]:
    """Names of the shared-memory segments in /dev/shm that start with ``prefix``."""
    try:
        return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    except FileNotFoundError:
        return []


def unlink_segments(names: list[str]) -> int:
    """Unlink the named segments (e.g. of a SIGKILLed worker); returns how many existed."""
    removed = 0
    for name in names:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a shared-memory segment name: {name!r}")
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except FileNotFoundError:
            pass
    return removed


class ShmSegment:
    """One mapped segment; ``buf`` is a uint8 tensor over all of it, for copy_ in and out."""

    def __init__(self, name: str, size: int = 0, *, create: bool) -> None:
        self.name = name
        self.created = create
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise FileExistsError(
                f"shared-memory segment {name} already exists: a process with the same tag "
                f"is running, or one died without cleanup (remove it with "
                f"mstar.transport.shm.unlink_segments)"
            ) from None
        except FileNotFoundError:
            raise KeyError(f"shared-memory segment {name} does not exist (its process freed it or exited)") from None
        try:
            if create:
                os.ftruncate(fd, size)
            st = os.fstat(fd)
            self.size, self.inode = st.st_size, st.st_ino
            self._mmap = mmap.mmap(fd, self.size, flags=_FLAGS) if self.size else None
        except BaseException:
            if create:
                os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.buf = (
            torch.frombuffer(self._mmap, dtype=torch.uint8)
            if self._mmap is not None
            else torch.empty(0, dtype=torch.uint8)
        )
        self.addr = self.buf.data_ptr()  # valid while ``buf`` (which pins the mapping) is alive

    def close(self) -> None:
        """Drop our mapping; the creator also unlinks, so the memory goes once every reader unmapped.

        Never ``mmap.close()``: tensors made by ``torch.frombuffer`` keep a reference to the
        mmap but no buffer export, so closing it would leave views of it dangling. Dropping
        our references unmaps it as soon as the last view is gone."""
        self.buf = torch.empty(0, dtype=torch.uint8)
        self._mmap = None
        if self.created:
            self.created = False
            unlink_segments([self.name])

    def is_current(self) -> bool:
        """False when the name now denotes another segment (its process restarted)."""
        try:
            return os.stat(os.path.join(SHM_DIR, self.name)).st_ino == self.inode
        except FileNotFoundError:
            return False


class PeerSegments:
    """Reads other processes' segments: arenas are mapped once and cached, overflow segments
    (one tensor each, unlinked soon after) are mapped for one read only, so a reader never
    keeps freed memory alive."""

    def __init__(self) -> None:
        self._arenas: dict[str, ShmSegment] = {}
        self._lock = threading.Lock()

    def read(self, name: str, offset: int, dst: int, count: int, key: str) -> None:
        """Copies ``count`` bytes at ``offset`` of segment ``name`` to address ``dst``."""
        if not name.endswith(".arena"):
            seg = ShmSegment(name, create=False)
            try:
                memcpy(dst, self._address(seg, offset, count, key), count)
            finally:
                seg.close()
            return
        with self._lock:
            seg = self._arenas.get(name)
            if seg is not None and not seg.is_current():  # the peer restarted: a new segment, same name
                seg.close()
                seg = None
            if seg is None:
                self._drop_stale()
                seg = self._arenas[name] = ShmSegment(name, create=False)
            pin = seg.buf  # our own reference: the mapping outlives a concurrent close() during the copy
        memcpy(dst, self._address(seg, offset, count, key), count)
        del pin

    def view(self, name: str, offset: int, count: int, key: str) -> torch.Tensor:
        """A uint8 tensor over ``count`` bytes at ``offset`` of segment ``name``: no copy.

        The tensor pins the mapping (an arena replaced by a restarted peer, or an overflow
        segment its producer unlinked, stays mapped while the view lives); its bytes are
        the producer's until the producer frees the owner."""
        if not name.endswith(".arena"):
            seg = ShmSegment(name, create=False)
            self._address(seg, offset, count, key)
            out = seg.buf[offset : offset + count]
            seg.close()  # unmapped once ``out`` goes
            return out
        with self._lock:
            seg = self._arenas.get(name)
            if seg is not None and not seg.is_current():
                seg.close()
                seg = None
            if seg is None:
                self._drop_stale()
                seg = self._arenas[name] = ShmSegment(name, create=False)
            self._address(seg, offset, count, key)
            return seg.buf[offset : offset + count]

    def _drop_stale(self) -> None:
        """Forget arenas of peers that are gone (a restarted peer has a new name): holding
        them would pin their memory for good. Called with the lock held, on a new mapping."""
        for name in [n for n, seg in self._arenas.items() if not seg.is_current()]:
            self._arenas.pop(name).close()

    @staticmethod
    def _address(seg: ShmSegment, offset: int, count: int, key: str) -> int:
        if offset < 0 or offset + count > seg.size:
            raise ValueError(
                f"tensor {key}: bytes {offset}..{offset + count} lie outside segment {seg.name} ({seg.size} bytes)"
            )
        return seg.addr + offset

    def close(self) -> None:
        with self._lock:
            for seg in self._arenas.values():
                seg.close()
            self._arenas.clear()
