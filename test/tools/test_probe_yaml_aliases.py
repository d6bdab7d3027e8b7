"""tools/probe_yaml_aliases.py loads each hostile file in a child process and reports how it ended."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).parents[2] / "tools" / "probe_yaml_aliases.py"


@pytest.mark.slow
def test_every_hostile_file_is_refused_quickly_with_its_file_and_line(tmp_path):
    out_json = tmp_path / "probe.json"
    out = subprocess.run(
        [sys.executable, str(TOOL), "--levels", "9", "--timeout", "60", "--max-rss-mb", "500", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out_json.read_text())
    assert set(results) == {"placement-aliases", "engine-aliases", "placement-truncated", "placement-deep"}
    for name, result in results.items():
        assert result["outcome"] == "refused", (name, result)
        assert "hostile.yaml:" in result["message"] and result["rss_growth_mb"] < 100, (name, result)
    assert "aliases are not accepted" in results["placement-aliases"]["message"]
    assert len(out.stdout.strip().splitlines()) == 4
