"""Shared by the gateway tests: the tiny Orpheus and Qwen3-Omni speech models, loaded once; a microphone WAV."""

from __future__ import annotations

import pytest

from mstar_ros.webrtc.speech_models import load_speech_model
from support.speech_wav import write_speech_wav


@pytest.fixture(scope="package")
def orpheus():
    return load_speech_model("orpheus", progress=False)


@pytest.fixture(scope="package")
def speech_wav(tmp_path_factory):
    """2.5 s of silence, a spoken sentence, 1.5 s of silence: (path, seconds of speech)."""
    return write_speech_wav(tmp_path_factory.mktemp("mic"))


@pytest.fixture(scope="package")
def speech_wav_long_pause(tmp_path_factory):
    """2.5 s of silence, a spoken sentence, 8 s of silence: a player that loops it (Chromium's fake
    microphone) speaks again only well after a short answer is done, however slow the machine."""
    return write_speech_wav(tmp_path_factory.mktemp("mic_long_pause"), silence_after_s=8.0)


@pytest.fixture(scope="package")
def qwen3_omni():
    return load_speech_model("qwen3-omni", progress=False)
