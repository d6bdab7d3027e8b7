"""``speed``: the same speech in 1/speed of the time, streamed chunk by chunk, its pitch kept."""

from __future__ import annotations

import numpy as np
import pytest

from mstar_ros.webrtc.audio_tempo import TimeStretch, atempo_factors

RATE = 24_000


def tone(seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * hz * t) * 0.4 * 32767).astype(np.int16)


def pitch(pcm: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(float) * np.hanning(len(pcm))))
    return float(np.argmax(spectrum) * RATE / len(pcm))


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 2.0, 4.0])
def test_the_duration_scales_by_one_over_speed_and_the_pitch_stays(speed):
    pcm = tone(2.0)
    stretch = TimeStretch(speed, RATE)
    out = np.concatenate([stretch.push(chunk) for chunk in np.array_split(pcm, 7)] + [stretch.finish()])
    want = len(pcm) / speed
    assert abs(len(out) - want) <= 0.03 * want, (speed, len(out), want)
    assert abs(pitch(out[len(out) // 4 : 3 * len(out) // 4]) - 220.0) < 5.0


def test_factors_stay_within_what_one_atempo_blends():
    for speed in (0.25, 0.3, 0.5, 1.0, 2.0, 3.0, 4.0):
        factors = atempo_factors(speed)
        assert all(0.5 <= f <= 2.0 for f in factors) and np.isclose(np.prod(factors), speed), (speed, factors)


@pytest.mark.parametrize("speed", [0.2, 4.5])
def test_a_speed_outside_openais_range_is_refused(speed):
    with pytest.raises(ValueError, match=r"outside \[0.25, 4\]"):
        TimeStretch(speed, RATE)
