"""The engine settings of one front-end of the edge box: its engine_config file, with the box's --dtype over it."""

from __future__ import annotations

import msgspec


def front_engine_config(path: str, dtype: str | None):
    """EngineConfig from ``path`` ("" : the defaults), ``dtype`` over it when given (not None or "")."""
    from mstar.engine.config import EngineConfig, load_engine_config

    config = load_engine_config(path) if path else EngineConfig()
    return msgspec.structs.replace(config, dtype=dtype) if dtype else config
