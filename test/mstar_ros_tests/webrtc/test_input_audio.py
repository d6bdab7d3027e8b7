"""input_audio_buffer.append's audio: base64 pcm16 at 24 kHz, held until commit, resampled for the model."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from mstar_ros.webrtc.events import EventError
from mstar_ros.webrtc.input_audio import AppendedAudio


def pcm16(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (np.sin(2 * np.pi * hz * t) * 12_000).astype("<i2")


def test_pieces_are_one_turn_at_the_models_rate():
    tone = pcm16(0.5)
    buffer = AppendedAudio()
    for piece in np.array_split(tone, 7):  # pieces of any size, odd ones too
        buffer.append(base64.b64encode(piece.tobytes()).decode())
    assert buffer.ms == 500
    same = buffer.take(24_000)
    assert np.array_equal(same, tone.astype(np.float32) / 32768.0) and buffer.samples == 0
    buffer.append(base64.b64encode(tone.tobytes()).decode())
    at_16k = buffer.take(16_000)
    assert abs(len(at_16k) - 8000) <= 32  # the resampler's delay, flushed
    spectrum = np.abs(np.fft.rfft(at_16k[1000:7000]))
    assert abs(np.argmax(spectrum) * 16_000 / 6000 - 440) < 5  # the same tone


def test_bad_audio_a_full_buffer_and_a_short_commit_are_errors_and_keep_what_came():
    buffer = AppendedAudio(max_s=1.0)
    buffer.append(base64.b64encode(pcm16(0.6).tobytes()).decode())
    for bad, message in (
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"abc").decode(), "2 a sample"),
        (None, "needs audio"),
        (base64.b64encode(pcm16(0.6).tobytes()).decode(), "at most 1 s"),
    ):
        with pytest.raises(EventError, match=message) as refused:
            buffer.append(bad)
        assert refused.value.param == "audio"
    assert buffer.ms == 600  # what came before stays
    buffer.clear()
    buffer.append(base64.b64encode(pcm16(0.05).tobytes()).decode())
    with pytest.raises(EventError, match="at least 100 ms"):
        buffer.take(16_000)
