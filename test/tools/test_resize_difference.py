"""tools/resize_difference.py runs and reports the openpi-vs-LeRobot resize difference it documents."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).parents[2] / "tools" / "resize_difference.py"


def test_it_prints_the_difference_per_size():
    out = subprocess.run(
        [sys.executable, str(TOOL), "--sizes", "320x240", "--frames", "2"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("320x240: mean |openpi - lerobot| = ") and "2 frames" in line
    mean = float(line.split("= ")[1].split(",")[0])
    assert 0 < mean < 0.05  # they differ (PIL antialiases, LeRobot does not), and only a little on average
