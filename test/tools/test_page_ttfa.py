"""tools/page_ttfa.py starts a real gateway and reads the page's own time to first audio in headless Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).parents[2] / "tools" / "page_ttfa.py"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_one_typed_turn_on_orpheus_is_measured_on_the_page(tmp_path):
    out_json = tmp_path / "ttfa.json"
    out = subprocess.run(
        [sys.executable, str(TOOL), "--model", "orpheus", "--turns", "2", "--warmup", "0", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    typed = json.loads(out_json.read_text())["typed"]
    assert typed["n"] == 2 and len(typed["all_ms"]) == 2 and 0 < typed["min_ms"] <= typed["p50_ms"] <= typed["max_ms"]
    assert "orpheus typed: p50" in out.stdout
