"""Where a bench's figures go: its summary printed, its JSON and its PNG written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write_report(
    report: dict, lines: list[str], json_path: Path, plot: Callable[[dict, Path], None], plot_path: Path
) -> None:
    """Print the summary, write the JSON and the PNG (``plot(report, path)``), say where."""
    print("\n".join(lines))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, plot_path)
    print(f"wrote {json_path} and {plot_path}")
