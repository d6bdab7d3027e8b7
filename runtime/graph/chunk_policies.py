"""Chunk policies: when a streaming connection hands a chunk of accumulated items to its consumer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """Items ``[start, end)`` of the stream; the first ``left_context`` of them were
    already delivered in an earlier chunk and are there as context only.

    ``first`` / ``final`` mark the stream's first chunk and the one a policy sends when the
    stream closes, for consumers whose crop differs at the edges (the consumer sees them as
    ``meta["first"]`` / ``meta["final"]``)."""

    start: int
    end: int
    left_context: int = 0
    first: bool = False
    final: bool = False

    @property
    def new_items(self) -> int:
        return self.end - self.start - self.left_context


class ChunkPolicy(ABC):
    """Pure function of (cursor, available, closed) -> chunks; the conductor keeps the cursor.

    ``cursor`` is the end of the last chunk emitted (0 at first); ``available`` the number
    of items produced so far; ``closed`` whether the producer has finished.
    """

    @abstractmethod
    def ready(self, cursor: int, available: int, closed: bool) -> list[Chunk]: ...

    def final(self, cursor: int, available: int) -> Chunk | None:
        """Called once when the stream closes, after ``ready``: one last chunk, or None."""
        return None


@dataclass(frozen=True)
class FixedChunkPolicy(ChunkPolicy):
    """Chunks of ``size`` new items; on close, the remainder as a shorter chunk."""

    size: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"FixedChunkPolicy size must be >= 1, got {self.size}")

    def ready(self, cursor: int, available: int, closed: bool) -> list[Chunk]:
        chunks = []
        while available - cursor >= self.size:
            chunks.append(Chunk(cursor, cursor + self.size))
            cursor += self.size
        if closed and available > cursor:
            chunks.append(Chunk(cursor, available))
        return chunks


@dataclass(frozen=True)
class LeftContextChunkPolicy(ChunkPolicy):
    """Chunks of ``chunk`` new items, each preceded by up to ``left_context`` earlier items
    (Qwen3-Omni Talker -> Code2Wav: 25 frames with 25 frames of left context). ``first_chunk``
    (default ``chunk``) makes the first chunk shorter, for a lower time to first output.

    ``edges``: for a consumer whose output at the stream's end differs (an STFT reflects the signal
    there), the first chunk is marked ``first``, and the stream's last chunk ``final``: when it closes,
    what is left goes as that chunk after its left context (nothing new left: the last
    ``left_context`` items, all context)."""

    chunk: int
    left_context: int
    first_chunk: int | None = None
    edges: bool = False

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.left_context < 0 or (self.first_chunk is not None and self.first_chunk < 1):
            raise ValueError(
                f"LeftContextChunkPolicy needs chunk >= 1, left_context >= 0 and first_chunk >= 1, got "
                f"{self.chunk}, {self.left_context}, {self.first_chunk}"
            )
        if self.edges and self.left_context < 1:
            raise ValueError("LeftContextChunkPolicy with edges needs left_context >= 1 (its final chunk is context)")

    def _chunk(self, cursor: int, end: int) -> Chunk:
        start = max(0, cursor - self.left_context)
        return Chunk(start, end, cursor - start, first=self.edges and cursor == 0)

    def final(self, cursor: int, available: int) -> Chunk | None:
        if not self.edges or not available:
            return None
        start = max(0, cursor - self.left_context)
        return Chunk(start, available, cursor - start, first=cursor == 0, final=True)

    def ready(self, cursor: int, available: int, closed: bool) -> list[Chunk]:
        chunks = []
        while available - cursor >= (size := self.chunk if cursor or self.first_chunk is None else self.first_chunk):
            chunks.append(self._chunk(cursor, cursor + size))
            cursor += size
        if closed and available > cursor and not self.edges:
            chunks.append(self._chunk(cursor, available))
        return chunks


@dataclass(frozen=True)
class WholeStreamPolicy(ChunkPolicy):
    """One chunk of every item, when the stream closes: for a consumer that needs all of it at once
    (an encoder whose input is normalised over the whole clip), fed by a stage that streams."""

    def ready(self, cursor: int, available: int, closed: bool) -> list[Chunk]:
        return [Chunk(cursor, available)] if closed and available > cursor else []


@dataclass(frozen=True)
class SlidingWindowChunkPolicy(ChunkPolicy):
    """The last ``window`` items, every ``stride`` new items once ``window`` exist
    (Orpheus: 28-token windows every 7 tokens). Items after the last full stride are
    not delivered, as in the reference decoders.

    ``edges``: so the consumer can deliver what its per-window crop leaves out at both ends
    (the Orpheus reference decoder drops the first frame and the last two: the end of the
    last word), the first window is marked ``first`` and the last one ``final``. To know a
    window is the last, each is held back until one more item arrives or the stream closes
    (one item of latency). A stream that closes with items after its last full stride had
    its last window sent already: it gets that window again as a ``final`` chunk that is
    all context (``left_context == window``). A stream shorter than a window comes whole,
    ``first`` and ``final``."""

    window: int
    stride: int
    edges: bool = False

    def __post_init__(self) -> None:
        if self.stride < 1 or self.window < self.stride:
            raise ValueError(
                f"SlidingWindowChunkPolicy needs 1 <= stride <= window, got window={self.window}, stride={self.stride}"
            )

    def ready(self, cursor: int, available: int, closed: bool) -> list[Chunk]:
        chunks = []
        end = self.window if cursor < self.window else cursor + self.stride
        while end <= available and (not self.edges or closed or available > end):
            first = end == self.window
            last = self.edges and closed and end == available  # items after it: final() sends it again
            chunks.append(
                Chunk(
                    end - self.window,
                    end,
                    0 if first else self.window - self.stride,
                    first=first and self.edges,
                    final=last,
                )
            )
            end += self.stride
        return chunks

    def final(self, cursor: int, available: int) -> Chunk | None:
        if not self.edges:
            return None
        if cursor >= self.window:  # the last window went out before the close: again, as context only
            return Chunk(cursor - self.window, cursor, self.window, final=True) if available > cursor else None
        whole = available // self.stride * self.stride
        return Chunk(0, whole, 0, first=True, final=True) if whole else None
