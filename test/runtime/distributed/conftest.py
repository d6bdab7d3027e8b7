"""The toy models of test/support are registered for these tests only, in the environment:
the test's Conductor resolves the name, and the Worker processes it launches inherit it."""

from __future__ import annotations

import pytest

from mstar.worker.registry import MODELS
from support.toy_factory import REGISTRATION


@pytest.fixture(autouse=True)
def toy_models_registered(monkeypatch):
    monkeypatch.setenv(MODELS.env, REGISTRATION)
