"""Where mstar keeps what it makes once per machine: ``$MSTAR_CACHE``, else ``~/.cache/mstar_ros``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("MSTAR_CACHE", Path.home() / ".cache" / "mstar_ros"))
