"""A peer's microphone: decoded, resampled to 16 kHz, through a real voice activity detector (silero-vad).

silero-vad (its wheel ships the model) scores 512-sample windows (32 ms at 16 kHz); its
``VADIterator`` says where speech starts and where it stops, a stop only after
``silence_duration_ms`` of silence (the end of a turn). Times are ms of the peer's audio.
"""
from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np
import torch

VAD_RATE = 16_000
WINDOW = 512  # samples silero-vad scores at 16 kHz


@dataclass(frozen=True)
class SpeechEvent:
    kind: str   # "started" or "stopped"
    ms: int     # position in the peer's audio


class SpeechDetector:
    def __init__(self, silence_duration_ms: int = 500, threshold: float = 0.5) -> None:
        from silero_vad import VADIterator, load_silero_vad

        self._vad = VADIterator(load_silero_vad(), threshold=threshold, sampling_rate=VAD_RATE,
                                min_silence_duration_ms=silence_duration_ms)
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=VAD_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self.speaking = False

    def feed(self, frame: av.AudioFrame) -> list[SpeechEvent]:
        """One decoded frame of the peer's audio (any rate and layout) -> the speech events it completes."""
        pcm = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        if pcm:
            self._pending = np.concatenate([self._pending, *(p.astype(np.float32) / 32768.0 for p in pcm)])
        events = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            with torch.inference_mode():
                found = self._vad(torch.from_numpy(window.copy()))
            if found and "start" in found:
                self.speaking = True
                events.append(SpeechEvent("started", int(found["start"]) * 1000 // VAD_RATE))
            elif found and "end" in found:
                self.speaking = False
                events.append(SpeechEvent("stopped", int(found["end"]) * 1000 // VAD_RATE))
        return events
