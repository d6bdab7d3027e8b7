"""The VAD's turn handed out while it is said (SpeechDetector.fresh_turn_audio): whatever the speech
probabilities do, what was handed out plus the stop's tail is exactly the stop's turn audio."""

from __future__ import annotations

import av
import numpy as np
import pytest
import torch

from mstar_ros.webrtc.audio_in import WINDOW, SpeechDetector


class Scripted:
    """Stands in for silero's model: the speech probability of each 512-sample window, in turn."""

    def __init__(self, probabilities: list[float]) -> None:
        self.probabilities = list(probabilities)

    def __call__(self, x, rate):
        return torch.tensor(self.probabilities.pop(0) if self.probabilities else 0.0)

    def reset_states(self):
        pass


def frames(samples: np.ndarray, size: int = 320):
    """16 kHz s16 mono frames of ``size`` samples (a microphone's 20 ms)."""
    pcm = (samples * 32767).astype(np.int16)
    for at in range(0, len(pcm) - size + 1, size):
        frame = av.AudioFrame.from_ndarray(pcm[None, at : at + size], format="s16", layout="mono")
        frame.sample_rate = 16000
        yield frame


@pytest.mark.parametrize(
    "script",
    [
        [0.0] * 5 + [0.9] * 30 + [0.0] * 40,  # speech, then silence
        [0.0] * 5 + [0.9] * 10 + [0.1] + [0.4] * 40 + [0.0] * 40,  # a pause that hovers (no reset)
        [0.0] * 5 + [0.9] * 10 + [0.1] * 8 + [0.9] * 10 + [0.0] * 40,  # a pause, then speech again
    ],
)
def test_what_is_handed_out_is_exactly_the_turn(script):
    detector = SpeechDetector(silence_duration_ms=500)
    detector._vad.model = Scripted(script)
    samples = np.random.RandomState(0).uniform(-0.3, 0.3, (len(script) + 10) * WINDOW).astype(np.float32)
    handed, turns = [], []
    for frame in frames(samples):
        for event in detector.feed(frame):
            if event.kind == "stopped":
                handed.append(event.tail)
                turns.append(event.audio)
        handed.append(detector.fresh_turn_audio())
    assert len(turns) == 1 and len(turns[0]) > 10 * WINDOW
    got = np.concatenate(handed)
    assert np.array_equal(got, turns[0])
