"""A peer's microphone: decoded, resampled to 16 kHz, through a real voice activity detector (silero-vad).

silero-vad (its wheel ships the model) scores 512-sample windows (32 ms at 16 kHz); its
``VADIterator`` says where speech starts and where it stops, a stop only after
``silence_duration_ms`` of silence (the end of a turn). Times are ms of the peer's audio. A stop
carries the turn's audio (16 kHz float, from ``PRE_ROLL_MS`` before the start to the stop), for a
model that listens; a turn longer than ``MAX_TURN_S`` keeps its last ``MAX_TURN_S``.

For a model that hears a turn while it is said, :meth:`SpeechDetector.fresh_turn_audio` hands out
the turn's samples as they come. While the VAD hears speech, the turn's end will lie after every
sample scored so far; once it hears a pause (its ``temp_end``), the end can be no earlier than that
pause's start plus its pad, and nothing past it is handed out until the speech goes on. The stop's
``tail`` is the rest, so what was handed out is exactly the stop's ``audio`` (for turns up to
``MAX_TURN_S``).
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np
import torch

VAD_RATE = 16_000
WINDOW = 512  # samples silero-vad scores at 16 kHz
PRE_ROLL_MS = 300  # kept before the detected start: the VAD fires a little after speech begins
MAX_TURN_S = 60.0


@dataclass(frozen=True)
class SpeechEvent:
    kind: str  # "started" or "stopped"
    ms: int  # position in the peer's audio
    audio: np.ndarray | None = None  # "stopped": the turn's 16 kHz float samples
    tail: np.ndarray | None = None  # "stopped": those fresh_turn_audio had not handed out yet


class SpeechDetector:
    def __init__(self, silence_duration_ms: int = 500, threshold: float = 0.5) -> None:
        from silero_vad import VADIterator, load_silero_vad

        self._vad = VADIterator(
            load_silero_vad(), threshold=threshold, sampling_rate=VAD_RATE, min_silence_duration_ms=silence_duration_ms
        )
        self._handed = 0  # stream position up to which the turn's samples were handed out
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=VAD_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self.speaking = False
        self._kept = np.zeros(0, dtype=np.float32)  # the latest samples (the turn so far, or the pre-roll)
        self._kept_from = 0  # stream position of _kept[0]
        self._fed = 0  # samples scored so far
        self._turn_start = 0

    def feed(self, frame: av.AudioFrame) -> list[SpeechEvent]:
        """One decoded frame of the peer's audio (any rate and layout) -> the speech events it completes."""
        pcm = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        if pcm:
            self._pending = np.concatenate([self._pending, *(p.astype(np.float32) / 32768.0 for p in pcm)])
        events = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            self._keep(window)
            with torch.inference_mode():
                found = self._vad(torch.from_numpy(window.copy()))
            if found and "start" in found:
                self.speaking = True
                self._turn_start = max(self._kept_from, int(found["start"]) - PRE_ROLL_MS * VAD_RATE // 1000)
                self._handed = self._turn_start
                events.append(SpeechEvent("started", int(found["start"]) * 1000 // VAD_RATE))
            elif found and "end" in found:
                self.speaking = False
                end = int(found["end"])
                turn = self._slice(self._turn_start, end)
                tail = self._slice(self._handed, end)
                self._handed = end
                events.append(SpeechEvent("stopped", end * 1000 // VAD_RATE, turn, tail))
        return events

    def _slice(self, start: int, end: int) -> np.ndarray:
        return self._kept[max(0, start - self._kept_from) : max(0, end - self._kept_from)].copy()

    def fresh_turn_audio(self) -> np.ndarray:
        """While a turn goes on: its samples not handed out yet, up to where its end may still fall (silero's
        VADIterator ends a turn at ``temp_end + speech_pad_samples - window``, ``temp_end`` being the
        sample count when the pause began, and 0 while it hears speech)."""
        if not self.speaking:
            return np.zeros(0, dtype=np.float32)
        pause = int(self._vad.temp_end)
        upto = self._fed if not pause else pause + int(self._vad.speech_pad_samples) - WINDOW
        fresh = self._slice(max(self._handed, self._kept_from), upto)
        self._handed = max(self._handed, upto)
        return fresh

    def _keep(self, window: np.ndarray) -> None:
        self._kept = np.concatenate([self._kept, window])
        self._fed += len(window)
        limit = int((MAX_TURN_S if self.speaking else PRE_ROLL_MS / 1000 + 1.0) * VAD_RATE)
        if len(self._kept) > limit:
            drop = len(self._kept) - limit
            self._kept, self._kept_from = self._kept[drop:], self._kept_from + drop
