"""Speech played faster or slower without changing its pitch: ``speed`` of ``/v1/audio/speech``.

FFmpeg's ``atempo`` filter (through PyAV) time-stretches as the chunks arrive. One ``atempo`` takes
factors from 0.5 up, so slower speeds chain several (0.25 = 0.5 x 0.5); above 2 it skips samples
instead of blending them (FFmpeg's documentation), so faster speeds chain factors of 2 as well.
"""

from __future__ import annotations

from fractions import Fraction

import av
import av.filter
import numpy as np

MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's range for speech


def atempo_factors(speed: float) -> list[float]:
    """``speed`` as a product of factors in [0.5, 2]."""
    factors, left = [], speed
    while left < 0.5:
        factors.append(0.5)
        left /= 0.5
    while left > 2.0:
        factors.append(2.0)
        left /= 2.0
    return factors + [left]


class TimeStretch:
    """Int16 mono chunks in, the same speech at ``speed`` times the pace out (``push`` each chunk,
    then ``finish`` once)."""

    def __init__(self, speed: float, rate: int) -> None:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed {speed:g} is outside [{MIN_SPEED:g}, {MAX_SPEED:g}]")
        self.rate = rate
        self._graph = av.filter.Graph()
        nodes = [self._graph.add_abuffer(format="s16", sample_rate=rate, layout="mono", time_base=Fraction(1, rate))]
        nodes += [self._graph.add("atempo", f"{factor:.6f}") for factor in atempo_factors(speed)]
        nodes += [self._graph.add("aformat", "sample_fmts=s16:channel_layouts=mono"), self._graph.add("abuffersink")]
        self._graph.link_nodes(*nodes).configure()
        self._pts = 0

    def push(self, pcm: np.ndarray) -> np.ndarray:
        pcm = np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1)
        if not len(pcm):
            return pcm
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = self.rate, self._pts, Fraction(1, self.rate)
        self._pts += len(pcm)
        self._graph.push(frame)
        return self._pull()

    def finish(self) -> np.ndarray:
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(out) if out else np.zeros(0, np.int16)
