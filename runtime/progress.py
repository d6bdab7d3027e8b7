"""Progress bars that never fail, or hang, the work they report (why: docs/performance.md, "Progress bars")."""

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
