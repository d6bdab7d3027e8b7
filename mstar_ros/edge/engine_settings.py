"""The engine settings of the edge box's front-ends: their engine_config files, with the box's --dtype over them.

The edge config itself is read before torch is imported (mstar_ros.edge.config); the engine configs
need torch (EngineConfig), so ``check_engine_configs`` reads them all in a second step, still before any
front-end starts: a bad field fails at once, naming the edge file's line, not after others started.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from mstar_ros.edge.config import EdgeFile


def front_engine_config(path: str, dtype: str | None):
    """EngineConfig from ``path`` ("" : the defaults), ``dtype`` over it when given (not None or "")."""
    from mstar.engine.config import EngineConfig, load_engine_config

    config = load_engine_config(path) if path else EngineConfig()
    return msgspec.structs.replace(config, dtype=dtype) if dtype else config


def engine_config_fields(edge: EdgeFile) -> Iterator[tuple[tuple, str]]:
    """(field path in the edge config, engine_config text) of every front-end that sets one."""
    for i, group in enumerate(edge.config.processes):
        at = ("processes", i)
        if group.pi05 is not None and group.pi05.engine_config:
            yield at + ("pi05", "engine_config"), group.pi05.engine_config
        for role in ("voice", "images"):
            served = getattr(group.gateway, role, None) if group.gateway is not None else None
            if served is not None and served.engine_config:
                yield at + ("gateway", role, "engine_config"), served.engine_config


def check_engine_configs(edge: EdgeFile) -> None:
    """Loads every front-end's engine_config; EdgeConfigError naming the edge file's line and field.
    Imports torch only when some front-end sets one."""
    fields = list(engine_config_fields(edge))
    if not fields:
        return
    from mstar.engine.config import load_engine_config

    for at, text in fields:
        try:
            load_engine_config(edge.path(text))
        except (ValueError, OSError) as exc:
            raise edge.error(at, str(exc)) from None
