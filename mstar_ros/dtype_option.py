"""``--dtype``: one spelling and one help text for every command and node set that chooses a compute dtype."""

from __future__ import annotations

import argparse

from mstar.engine.dtype_names import DTYPE_NAMES

DTYPE_HELP = (
    "auto: the fastest dtype this machine runs natively -- bfloat16 on CPUs with AVX512-BF16 or AMX and on "
    "GPUs with bf16, float32 where bf16 would be emulated (AVX2-only CPUs), measured once where the CPU's "
    "flags cannot tell; the log and the output say which and why"
)


def add_dtype_argument(
    parser: argparse.ArgumentParser, *, default: str | None = "auto", what: str = "compute dtype", flag: str = "--dtype"
) -> None:
    """``flag`` with the dtype names; ``default`` None means "from --engine-config, else auto"."""
    when = "default: from --engine-config, else auto" if default is None else f"default {default}"
    parser.add_argument(
        flag, choices=DTYPE_NAMES, default=default, help=f"{what}: {', '.join(DTYPE_NAMES)} ({when}). " + DTYPE_HELP
    )


def engine_config(args: argparse.Namespace):
    """The engine settings of ``--engine-config`` (else the defaults), with ``--dtype`` over them when given."""
    import msgspec

    from mstar.engine.config import EngineConfig, load_engine_config

    config = load_engine_config(args.engine_config) if getattr(args, "engine_config", None) else EngineConfig()
    if getattr(args, "dtype", None):
        config = msgspec.structs.replace(config, dtype=args.dtype)
    return config
