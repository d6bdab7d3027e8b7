"""What the gateway measures of each response, and the spoken turn that streams into a request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class StreamedTurn:
    """A spoken turn whose samples stream into its request while it is said."""

    request: object
    stream: object  # its SampleStream: push samples, close at the turn's end
    ended: asyncio.Future  # the time (time.monotonic()) the turn ended
    pieces: list = field(default_factory=list)  # the samples that went in: the turn the conversation keeps
    failed: bool = False  # its stream failed (over the limit): the rest of the turn is dropped
    streamed_before_end: int = 0  # samples that went in while the user was still speaking
    item_id: str | None = None  # its conversation item, once committed

    @property
    def audio(self):
        import numpy as np

        return np.concatenate(self.pieces) if self.pieces else None


@dataclass
class ResponseTiming:
    """One response's times (time.monotonic()): what the benchmark splits into model time and gateway overhead."""

    response_id: str
    received: float  # response.create came off the data channel
    first_chunk: float | None = None  # the graph's first audio chunk came out of the Conductor
    first_frame: float | None = None  # the first audible 20 ms frame went to the encoder
    last_chunk: float | None = None
    audio_s: float = 0.0  # seconds of audio the graph produced
    underruns: int = 0  # silent frames sent mid-utterance (the model fell behind)
    status: str = "in_progress"

    @property
    def model_ttfa_ms(self) -> float | None:
        return None if self.first_chunk is None else (self.first_chunk - self.received) * 1000

    @property
    def rtf(self) -> float | None:
        """Generation time over audio time (< 1: the model keeps ahead of real time)."""
        if self.last_chunk is None or not self.audio_s:
            return None
        return (self.last_chunk - self.received) / self.audio_s
