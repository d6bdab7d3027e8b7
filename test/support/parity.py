"""Parity tests run in float32: they match reference implementations to about 1e-6, which bf16 cannot hold.

``dtype: auto`` (the engines' default) picks bf16 on CPUs with bf16 instructions; every other test runs
with it, so both dtypes are exercised wherever the suite runs. Engines cast the modules they are given
in place: a test that shares modules with a parity test (session fixtures) must pin float32 too.
"""

from __future__ import annotations

from mstar.engine.config import EngineConfig


def fp32(**fields) -> EngineConfig:
    """EngineConfig(**fields) in float32."""
    return EngineConfig(dtype="float32", **fields)


FP32 = fp32()
