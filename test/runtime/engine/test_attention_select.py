"""select_attention_backend: CPU -> torch, clear errors for impossible or unknown choices."""

import logging

import pytest

from mstar.engine.attention.select import ENV_VAR, select_attention_backend
from mstar.engine.attention.torch_backend import TorchAttentionBackend
from mstar.engine.kv_cache import KVSpec, PagedKVCache


@pytest.fixture
def cpu_cache():
    return PagedKVCache(KVSpec(num_layers=1, num_kv_heads=1, head_dim=8), num_blocks=2, block_size=4)


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.mark.parametrize("name", [None, "auto", "torch", "TORCH"])
def test_cpu_picks_torch(cpu_cache, name, caplog):
    with caplog.at_level(logging.INFO, logger="mstar.attention"):
        b = select_attention_backend(cpu_cache, name)
    assert isinstance(b, TorchAttentionBackend) and b.cache is cpu_cache
    assert "attention backend: torch" in caplog.text


def test_auto_logs_why_not_flashinfer(cpu_cache, caplog):
    with caplog.at_level(logging.INFO, logger="mstar.attention"):
        select_attention_backend(cpu_cache)
    assert "CUDA" in caplog.text


def test_flashinfer_on_cpu_raises(cpu_cache):
    with pytest.raises(RuntimeError, match="'flashinfer' was requested .* only on CUDA"):
        select_attention_backend(cpu_cache, "flashinfer")


def test_env_overrides_argument(cpu_cache, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "flashinfer")
    with pytest.raises(RuntimeError, match=ENV_VAR):
        select_attention_backend(cpu_cache, "torch")
    monkeypatch.setenv(ENV_VAR, "torch")
    assert isinstance(select_attention_backend(cpu_cache, "flashinfer"), TorchAttentionBackend)


def test_unknown_name(cpu_cache):
    with pytest.raises(ValueError, match="unknown attention backend 'flash'.*auto, torch, flashinfer"):
        select_attention_backend(cpu_cache, "flash")
