"""A microphone recording for the WebRTC tests: silence, a spoken sentence (espeak-ng: real speech a VAD
detects), silence, as a 16-bit mono WAV."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np

SILENCE_BEFORE_S, SILENCE_AFTER_S = 2.5, 1.5


def write_speech_wav(
    out: Path, sentence: str = "Wait, stop. I have a question for you.", silence_after_s: float = SILENCE_AFTER_S
) -> tuple[Path, float]:
    """-> (the WAV's path, seconds of speech in it)."""
    spoken = out / "spoken.wav"
    subprocess.run(["espeak-ng", "-w", str(spoken), sentence], check=True)
    with wave.open(str(spoken)) as w:
        rate, speech = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    pcm = np.concatenate(
        [np.zeros(int(rate * SILENCE_BEFORE_S), np.int16), speech, np.zeros(int(rate * silence_after_s), np.int16)]
    )
    path = out / "mic.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path, len(speech) / rate
