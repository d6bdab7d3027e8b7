"""Generated fixtures (tiny checkpoints, bags) cached on disk, made once even with racing processes."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mstar.cache_dir import cache_root

log = logging.getLogger("mstar_graphs")


def cached_dir(name: str, make: Callable[[Path], None], what: str) -> Path:
    """``cache_root()/name``, filled by ``make(tmp_dir)`` on first use. Made in a temporary
    directory and renamed into place, so a reader never sees half a fixture."""
    root = cache_root() / name
    if not (root / "done").exists():
        log.info("generating %s in %s", what, root)
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
        make(tmp)
        (tmp / "done").write_text("ok\n")
        try:
            tmp.rename(root)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return root
