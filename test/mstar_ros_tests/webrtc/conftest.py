"""Shared by the gateway tests: the tiny Orpheus speech model, loaded once."""
from __future__ import annotations

import pytest

from mstar_ros.webrtc.speech_models import load_speech_model


@pytest.fixture(scope="package")
def orpheus():
    return load_speech_model("orpheus", progress=False)
