"""Progress bars that never fail, or hang, the work they report.

tqdm's ``refresh`` takes its class-wide write lock, writes, then releases it, with no ``finally``: a write
that raises (the terminal's reader gone: ``BrokenPipeError``, a closed file) leaves the lock held by that
thread for good. The next bar collected on another thread (every bar is closed at exit) then waits on it
forever: a node set whose stderr pipe had been closed hung at exit that way. Here a bar writes through a
stream that drops what it cannot write, once its reader is gone.
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm


class QuietOnBrokenPipe:
    """``stream``, with writes and flushes dropped from the first that fails (the reader gone)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # BrokenPipeError, EIO; ValueError: a closed file
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.gone = True

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno: what tqdm asks of its file
        return getattr(self._stream, name)


def progress_bar(*args: Any, file: TextIO | None = None, **kwargs: Any) -> tqdm:
    """``tqdm(*args, **kwargs)`` on ``file`` (default: stderr as it is now), through :class:`QuietOnBrokenPipe`."""
    return tqdm(*args, file=QuietOnBrokenPipe(file if file is not None else sys.stderr), **kwargs)
