"""``mstar-ros checkpoint info``: what a load would use, for the generated checkpoint and both released layouts."""
from __future__ import annotations

import subprocess
import sys

from support.pi05_layouts import lerobot_checkpoint, openpi_checkpoint

CLI = [sys.executable, "-m", "mstar_ros.cli", "-q", "checkpoint", "info"]
STATS = {"q01": [-1.0] * 8, "q99": [1.0] * 8, "mean": [0.0] * 8, "std": [1.0] * 8, "min": [-2.0] * 8,
         "max": [2.0] * 8}


def _info(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


def test_info_of_the_generated_and_the_released_layouts(tmp_path):
    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    tiny = ensure_tiny_pi05()
    out = _info()
    assert out.returncode == 0, out.stderr
    for line in ("layout: lerobot (generated, RANDOM weights)", "cameras: base_0_rgb, left_wrist_0_rgb",
                 "state: 8 dims (as text in the prompt)", "action: 8 dims (of the model's 32)",
                 "normalisation: QUANTILES (state and actions) from policy_preprocessor.json",
                 "sizes: vision ", "tokenizer: "):
        assert line in out.stdout, (line, out.stdout)
    openpi = openpi_checkpoint(tmp_path / "openpi", tiny, {"state": STATS, "actions": STATS},
                               asset_ids=("droid", "trossen"))
    out = _info(str(openpi), "--asset-id", "droid")
    assert out.returncode == 0, out.stderr
    assert "layout: openpi" in out.stdout and "from assets/droid/norm_stats.json" in out.stdout
    assert "cameras: base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb" in out.stdout
    lerobot = lerobot_checkpoint(tmp_path / "lerobot", tiny, {"observation.state": STATS, "action": STATS},
                                 modes={"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MIN_MAX"})
    out = _info(str(lerobot))
    assert "state MEAN_STD, actions MIN_MAX from" in out.stdout, out.stdout + out.stderr


def test_info_fails_in_one_line_naming_what_is_missing(tmp_path):
    import os

    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    bare = openpi_checkpoint(tmp_path / "bare", ensure_tiny_pi05(), None, tokenizer=False)
    out = _info(str(bare), env={**os.environ, "OPENPI_DATA_HOME": str(tmp_path / "none")})
    assert out.returncode == 2 and "no tokenizer found (tried " in out.stderr and "paligemma_tokenizer.model" in out.stderr
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert "Traceback" not in out.stderr and len(errors) == 1, out.stderr  # one line (the other: RANDOM weights)
    several = openpi_checkpoint(tmp_path / "several", ensure_tiny_pi05(), {"state": STATS, "actions": STATS},
                                asset_ids=("droid", "trossen"))
    out = _info(str(several))
    assert out.returncode == 2 and "choose one with --asset-id" in out.stderr
