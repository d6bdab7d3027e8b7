"""``mstar-ros``, the command line: one module per command (``main`` builds the parser from them)."""

from mstar_ros.cli.main import main

__all__ = ["main"]
