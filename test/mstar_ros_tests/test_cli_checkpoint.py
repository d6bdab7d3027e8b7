"""``mstar-ros checkpoint info``: what a load would use, for the generated checkpoint and both released layouts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.pi05_layouts import lerobot_checkpoint, openpi_checkpoint

CLI = [sys.executable, "-m", "mstar_ros.cli", "-q", "checkpoint", "info"]
STATS = {"q01": [-1.0] * 8, "q99": [1.0] * 8, "mean": [0.0] * 8, "std": [1.0] * 8, "min": [-2.0] * 8, "max": [2.0] * 8}


def _info(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_info_of_the_generated_and_the_released_layouts(tmp_path):
    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    tiny = ensure_tiny_pi05()
    out = _info()
    assert out.returncode == 0, out.stderr
    for line in (
        "layout: lerobot (generated, RANDOM weights)",
        "cameras: base_0_rgb, left_wrist_0_rgb",
        "state: 8 dims (as text in the prompt)",
        "action: 8 dims (of the model's 32)",
        "normalisation: QUANTILES (state and actions) from policy_preprocessor.json",
        "sizes: vision ",
        "tokenizer: ",
    ):
        assert line in out.stdout, (line, out.stdout)
    openpi = openpi_checkpoint(
        tmp_path / "openpi", tiny, {"state": STATS, "actions": STATS}, asset_ids=("droid", "trossen")
    )
    out = _info(str(openpi), "--asset-id", "droid")
    assert out.returncode == 0, out.stderr
    assert "layout: openpi" in out.stdout and "from assets/droid/norm_stats.json" in out.stdout
    assert "cameras: base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb" in out.stdout
    lerobot = lerobot_checkpoint(
        tmp_path / "lerobot",
        tiny,
        {"observation.state": STATS, "action": STATS},
        modes={"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MIN_MAX"},
    )
    out = _info(str(lerobot))
    assert "state MEAN_STD, actions MIN_MAX from" in out.stdout, out.stdout + out.stderr


def test_info_fails_in_one_line_naming_what_is_missing(tmp_path):
    import os

    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    bare = openpi_checkpoint(tmp_path / "bare", ensure_tiny_pi05(), None, tokenizer=False)
    out = _info(str(bare), env={**os.environ, "OPENPI_DATA_HOME": str(tmp_path / "none")})
    assert (
        out.returncode == 2 and "no tokenizer found (tried " in out.stderr and "paligemma_tokenizer.model" in out.stderr
    )
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert "Traceback" not in out.stderr and len(errors) == 1, out.stderr  # one line (the other: RANDOM weights)
    several = openpi_checkpoint(
        tmp_path / "several", ensure_tiny_pi05(), {"state": STATS, "actions": STATS}, asset_ids=("droid", "trossen")
    )
    out = _info(str(several))
    assert out.returncode == 2 and "choose one with --asset-id" in out.stderr


def test_info_of_a_lerobot_directory_prints_what_it_found_then_names_the_missing_tokenizer(tmp_path):
    """LeRobot saves no tokenizer: the layout, normalisation and shapes are printed first, then one error."""
    import os

    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    path = lerobot_checkpoint(
        tmp_path / "lerobot", ensure_tiny_pi05(), {"observation.state": STATS, "action": STATS}, tokenizer=False
    )
    out = _info(str(path), env={**os.environ, "OPENPI_DATA_HOME": str(tmp_path / "none")})
    assert out.returncode == 2, out.stdout + out.stderr
    for line in (
        "layout: lerobot",
        "cameras: base_0_rgb, wrist",
        "state: 8 dims",
        "action: 8 dims",
        "normalisation: QUANTILES (state and actions) from policy_preprocessor.json",
        "shapes: all ",
        "tokenizer: NONE FOUND",
    ):
        assert line in out.stdout, (line, out.stdout)
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"no tokenizer found (tried {path / 'tokenizer.model'}, " in errors[0]
    assert str(tmp_path / "none" / "big_vision" / "paligemma_tokenizer.model") in errors[0]


def test_info_of_a_path_that_does_not_exist_says_so(tmp_path):
    out = _info(str(tmp_path / "typo"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (
        f"mstar-ros checkpoint: error: {tmp_path / 'typo'}: no such directory "
        "(expected a pi0.5 PyTorch checkpoint directory: LeRobot's or openpi's conversion)"
    )


def test_info_names_sizes_the_tensors_do_not_have(tmp_path):
    """The architecture lines come from the variant names: a config whose sizes the weights do not have is
    printed with the parts and tensors at fault, then exits 2."""
    import json

    from mstar_graphs.pi05.checkpoints import ensure_tiny_pi05

    path = openpi_checkpoint(tmp_path / "openpi", ensure_tiny_pi05(), {"state": STATS, "actions": STATS})
    config = json.loads((path / "config.json").read_text())
    config["mstar_dims"]["action_expert"]["mlp_dim"] = 48
    (path / "config.json").write_text(json.dumps(config))
    out = _info(str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "shapes: the tensors in the headers DO NOT MATCH the sizes above:" in out.stdout
    assert (
        "  action expert (sizes from mstar_dims.action_expert and action_dim 32): 6 tensors differ in shape "
        "(first: paligemma_with_expert.gemma_expert.model.layers.0.mlp."
    ) in out.stdout
    assert "tokenizer: " in out.stdout  # everything else is printed too
    assert out.stderr.strip().endswith(
        "error: the checkpoint's tensors do not match the config's sizes in action expert (shapes: above)"
    ), out.stderr
