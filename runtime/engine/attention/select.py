"""Run-time choice of the attention backend: FlashInfer on CUDA when installed, torch otherwise."""

from __future__ import annotations

import logging
import os

import torch

from mstar.engine.attention.backend import AttentionBackend
from mstar.engine.kv_cache import PagedKVCache

log = logging.getLogger("mstar.attention")

ENV_VAR = "MSTAR_ATTENTION_BACKEND"
VALID_NAMES = ("auto", "torch", "flashinfer")


def _flashinfer_unusable(cache: PagedKVCache) -> str | None:
    """Why FlashInfer cannot serve this cache, or None if it can."""
    if cache.device.type != "cuda":
        return f"the KV cache is on {cache.device}, FlashInfer runs only on CUDA"
    try:
        import flashinfer  # noqa: F401
    except ImportError as e:
        return f"flashinfer cannot be imported ({e}); install flashinfer-python"
    from mstar.engine.attention.flashinfer_backend import _SUPPORTED_HEAD_DIMS, _SUPPORTED_KV_DTYPES

    if cache.dtype not in _SUPPORTED_KV_DTYPES:
        return f"the KV cache dtype is {cache.dtype}, FlashInfer needs float16 or bfloat16"
    if cache.spec.head_dim not in _SUPPORTED_HEAD_DIMS:
        return f"head_dim is {cache.spec.head_dim}; FlashInfer serves {_SUPPORTED_HEAD_DIMS}"
    return None


def select_attention_backend(cache: PagedKVCache, name: str | None = None) -> AttentionBackend:
    """Build the attention backend for ``cache``.

    ``MSTAR_ATTENTION_BACKEND`` (if set) overrides ``name``. None / "auto": FlashInfer when
    it can serve the cache, else torch. Asking for "flashinfer" where it cannot run raises.
    """
    env = os.environ.get(ENV_VAR)
    source = f"${ENV_VAR}" if env else "argument" if name else "default"
    choice = (env or name or "auto").strip().lower()
    if choice not in VALID_NAMES:
        raise ValueError(f"unknown attention backend {choice!r} (from {source}); valid: {', '.join(VALID_NAMES)}")

    if choice in ("auto", "flashinfer"):
        why_not = _flashinfer_unusable(cache)
        if why_not is None:
            from mstar.engine.attention.flashinfer_backend import FlashInferAttentionBackend

            log.info("attention backend: flashinfer (%s: %s; CUDA cache, package present)", source, choice)
            return FlashInferAttentionBackend(cache)
        if choice == "flashinfer":
            raise RuntimeError(f"attention backend 'flashinfer' was requested ({source}) but {why_not}")
        log.info("attention backend: torch (auto: %s)", why_not)
    else:
        log.info("attention backend: torch (%s: %s)", source, choice)
    from mstar.engine.attention.torch_backend import TorchAttentionBackend

    backend = TorchAttentionBackend(cache)
    if cache.device.type == "cpu":
        why = "AMX" if backend.compute_dtype == cache.dtype == torch.bfloat16 else "no AMX bf16, or not a bf16 cache"
        log.info("attention scores in %s (KV cache %s: %s)", backend.compute_dtype, cache.dtype, why)
    return backend
