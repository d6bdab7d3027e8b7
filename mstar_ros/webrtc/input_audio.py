"""``input_audio_buffer.append``: a turn's audio sent as events, for a client without a microphone track.

As OpenAI takes it: base64 of 16-bit little-endian mono PCM at 24 kHz, in pieces of any size; ``commit``
makes the pieces one user turn (resampled to the model's input rate), ``clear`` drops them. The buffer
holds at most ``MAX_TURN_S`` (a turn's limit at the microphone too); past it an append is refused, and
what came before stays.
"""

from __future__ import annotations

import base64
import binascii

import av
import numpy as np

from mstar_ros.webrtc.audio_in import MAX_TURN_S
from mstar_ros.webrtc.events import EventError

RATE = 24_000
MIN_COMMIT_MS = 100  # OpenAI refuses a smaller commit too


class AppendedAudio:
    def __init__(self, max_s: float = MAX_TURN_S) -> None:
        self._pieces: list[np.ndarray] = []
        self.samples = 0
        self.max_samples = int(max_s * RATE)

    @property
    def ms(self) -> int:
        return self.samples * 1000 // RATE

    def append(self, encoded: str | None) -> None:
        if not isinstance(encoded, str) or not encoded:
            raise EventError("input_audio_buffer.append needs audio: base64 pcm16 at 24 kHz", param="audio")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("audio is not valid base64", param="audio") from None
        if len(raw) % 2:
            raise EventError(f"audio has {len(raw)} bytes: pcm16 has 2 a sample", param="audio")
        piece = np.frombuffer(raw, dtype="<i2").astype(np.int16)
        if self.samples + len(piece) > self.max_samples:
            raise EventError(
                f"the input audio buffer holds at most {self.max_samples // RATE} s: commit or clear it first",
                param="audio",
                code="input_audio_buffer_full",
            )
        self._pieces.append(piece)
        self.samples += len(piece)

    def clear(self) -> None:
        self._pieces, self.samples = [], 0

    def take(self, rate: int) -> np.ndarray:
        """The buffer as one turn: float samples in [-1, 1] at ``rate``; the buffer is empty after."""
        if self.ms < MIN_COMMIT_MS:
            raise EventError(
                f"the input audio buffer holds {self.ms} ms: a turn needs at least {MIN_COMMIT_MS} ms",
                code="input_audio_buffer_commit_empty",
            )
        pcm = np.concatenate(self._pieces)
        self.clear()
        if rate != RATE:
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
            frame.sample_rate = RATE
            out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
            out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
            pcm = np.concatenate(out) if out else np.zeros(0, dtype=np.int16)
        return pcm.astype(np.float32) / 32768.0
