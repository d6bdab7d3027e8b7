"""tools/probe_gateway.py starts a real gateway, probes it and reports statuses and the server's memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).parents[2] / "tools" / "probe_gateway.py"


@pytest.mark.slow
def test_the_nested_json_probe_reports_400s_and_the_servers_memory(tmp_path):
    out_json = tmp_path / "probe.json"
    out = subprocess.run(
        [sys.executable, str(TOOL), "--probes", "nested", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    nested = json.loads(out_json.read_text())["nested"]
    assert [nested[r] for r in ("/offer", "/v1/audio/speech", "/v1/chat/completions")] == [400, 400, 400], nested
    assert 0 < nested["rss_before_mb"] <= nested["rss_peak_mb"] and nested["fds_after"] > 0
    bad = subprocess.run([sys.executable, str(TOOL), "--probes", "nested,bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown probes ['bogus']" in bad.stderr
