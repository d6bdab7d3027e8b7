"""The newest good camera frame of a BAGEL node, its pixels converted at most once; no ROS here.

A new frame replaces the one held (frames never queue up: a camera at any rate holds one message). Its
pixels are converted when a request first uses it, and every later request about the same frame shares
that array: a burst of questions about one frame converts it once, not once per question.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np


class LatestFrame:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._msg: Any = None
        self._arrived = 0.0
        self._pixels: np.ndarray | None = None
        self.conversions = 0  # frames converted (for tests and /diagnostics)

    def put(self, msg: Any, arrived: float) -> None:
        """Holds ``msg`` (arrived at ``arrived``, time.monotonic()) in place of the frame held."""
        with self._lock:
            self._msg, self._arrived, self._pixels = msg, arrived, None

    def held(self) -> tuple[Any, float] | None:
        """The frame held and when it arrived, or None before the first."""
        with self._lock:
            return None if self._msg is None else (self._msg, self._arrived)

    def pixels(self, msg: Any, convert: Callable[[Any], np.ndarray]) -> np.ndarray:
        """``msg``'s pixels, converted by ``convert`` only when they are not cached yet (the cache is kept while
        ``msg`` is the frame held). The array is read-only: requests share it."""
        with self._lock:
            if self._msg is msg and self._pixels is not None:
                return self._pixels
        pixels = convert(msg)
        pixels.setflags(write=False)
        with self._lock:
            self.conversions += 1
            if self._msg is msg:
                self._pixels = pixels
        return pixels
