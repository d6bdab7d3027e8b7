"""Released pi0.5 checkpoint layouts (LeRobot, openpi) inspected before any weight is read."""

from __future__ import annotations

import pytest

from mstar_graphs.pi05.checkpoint_layout import CheckpointError, describe, inspect_checkpoint
from mstar_graphs.pi05.normalization import Mode, NormalizationError
from mstar_graphs.pi05.tokenizer import TokenizerError
from support.pi05_layouts import lerobot_checkpoint, openpi_checkpoint, train_sentencepiece

STATE = {
    "q01": [-1.0 - i for i in range(8)],
    "q99": [1.0 + 2 * i for i in range(8)],
    "mean": [0.1 * i for i in range(8)],
    "std": [1.0 + i for i in range(8)],
}
ACTION = {
    "q01": [-0.5 * (i + 1) for i in range(8)],
    "q99": [0.25 * (i + 1) for i in range(8)],
    "mean": [-0.1 * i for i in range(8)],
    "std": [0.5 + i for i in range(8)],
}


def test_lerobot_layout(tmp_path, ckpt):
    path = lerobot_checkpoint(
        tmp_path / "ck",
        ckpt,
        {"observation.state": STATE, "action": ACTION},
        cameras=("image", "wrist_image"),
        empty_cameras=1,
    )
    layout = inspect_checkpoint(path)
    assert layout.kind == "lerobot" and layout.cameras == ("image", "wrist_image")
    assert layout.placeholder_cameras == ("empty_camera_0",)
    assert (layout.state_dim, layout.action_dim) == (8, 8)
    norm = layout.normalization
    assert norm.state.mode is Mode.QUANTILES and norm.state.flavour == "lerobot"
    assert norm.state.stats["q01"].tolist() == STATE["q01"] and norm.action.stats["q99"].tolist() == ACTION["q99"]
    text = "\n".join(describe(layout))
    assert "layout: lerobot" in text and "cameras: image, wrist_image (+ always masked: empty_camera_0)" in text
    assert "QUANTILES (state and actions) from policy_preprocessor.json + policy_postprocessor.json" in text


def test_lerobot_mode_per_feature_type(tmp_path, ckpt):
    path = lerobot_checkpoint(
        tmp_path / "ck",
        ckpt,
        {"observation.state": STATE, "action": ACTION},
        modes={"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "QUANTILES"},
    )
    norm = inspect_checkpoint(path).normalization
    assert (norm.state.mode, norm.action.mode) == (Mode.MEAN_STD, Mode.QUANTILES)


def test_lerobot_relative_actions_are_refused_clearly(tmp_path, ckpt):
    import json

    path = lerobot_checkpoint(tmp_path / "ck", ckpt, {"observation.state": STATE, "action": ACTION})
    pre = json.loads((path / "policy_preprocessor.json").read_text())
    pre["steps"][2]["config"]["enabled"] = True
    (path / "policy_preprocessor.json").write_text(json.dumps(pre))
    with pytest.raises(NormalizationError, match="relative_actions_processor' is enabled"):
        inspect_checkpoint(path)


def test_openpi_layout(tmp_path, ckpt):
    path = openpi_checkpoint(tmp_path / "ck", ckpt, {"state": STATE, "actions": ACTION})
    layout = inspect_checkpoint(path)
    assert layout.kind == "openpi" and layout.cameras == ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
    assert (layout.state_dim, layout.action_dim) == (8, 8)  # from the statistics: the model computes 32
    norm = layout.normalization
    assert norm.state.flavour == "openpi" and norm.state.mode is Mode.QUANTILES
    assert norm.source == "assets/physical-intelligence/libero/norm_stats.json"


def test_openpi_with_several_assets_needs_an_asset_id(tmp_path, ckpt):
    path = openpi_checkpoint(tmp_path / "ck", ckpt, {"state": STATE, "actions": ACTION}, asset_ids=("droid", "trossen"))
    with pytest.raises(NormalizationError, match=r"several robots \['droid', 'trossen'\]: choose one with --asset-id"):
        inspect_checkpoint(path)
    assert inspect_checkpoint(path, asset_id="trossen").normalization.source == "assets/trossen/norm_stats.json"
    with pytest.raises(NormalizationError, match="asset ids here"):
        inspect_checkpoint(path, asset_id="franka")


def test_openpi_without_assets_says_it_falls_back(tmp_path, ckpt):
    layout = inspect_checkpoint(openpi_checkpoint(tmp_path / "ck", ckpt, None))
    assert layout.normalization is None and layout.state_dim is None and layout.action_dim is None
    assert any("scaled by the joint limits" in n for n in layout.notes)
    assert any("discrete_state_input not in config.json" in n for n in layout.notes)
    assert "action: the robot joints dims (of the model's 32)" in "\n".join(describe(layout))


def test_openpi_quantiles_must_be_there(tmp_path, ckpt):
    path = openpi_checkpoint(
        tmp_path / "ck", ckpt, {"state": {"mean": [0.0], "std": [1.0]}, "actions": {"mean": [0.0], "std": [1.0]}}
    )
    with pytest.raises(NormalizationError, match="q01 / q99 are missing"):
        inspect_checkpoint(path)


def test_a_tokenizer_from_the_directory_the_flag_or_nowhere(tmp_path, ckpt, sp_model, monkeypatch):
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "openpi-cache"))
    path = openpi_checkpoint(tmp_path / "ck", ckpt, None, tokenizer=False)
    with pytest.raises(TokenizerError) as info:
        inspect_checkpoint(path)
    for tried in ("tokenizer.model", "paligemma_tokenizer.model", "tokenizer.json", "openpi-cache/big_vision"):
        assert tried in str(info.value)
    assert inspect_checkpoint(path, tokenizer=sp_model).tokenizer_file == sp_model
    cache = tmp_path / "openpi-cache" / "big_vision"
    cache.mkdir(parents=True)
    (cache / "paligemma_tokenizer.model").write_bytes(sp_model.read_bytes())
    assert inspect_checkpoint(path).tokenizer_file == cache / "paligemma_tokenizer.model"  # openpi's own cache


def test_a_missing_tokenizer_fails_before_any_weight_is_read(tmp_path, ckpt, monkeypatch):
    """The weights file is garbage: reading it would fail with a safetensors error, not the tokenizer's."""
    from mstar_graphs.pi05.frontend import Pi05Policy

    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "nothing"))
    path = lerobot_checkpoint(tmp_path / "ck", ckpt, {"observation.state": STATE, "action": ACTION}, tokenizer=False)
    (path / "model.safetensors").write_bytes(b"\x00not safetensors" * 1000)
    with pytest.raises(TokenizerError, match="no tokenizer found"):
        Pi05Policy.load(path)
    with pytest.raises(TokenizerError, match="no tokenizer found"):
        Pi05Policy.load(path, load_weights=False)


def test_weights_and_config_are_checked_too(tmp_path, ckpt):
    path = lerobot_checkpoint(tmp_path / "ck", ckpt, {"observation.state": STATE, "action": ACTION})
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        inspect_checkpoint(path)
    with pytest.raises(CheckpointError, match="no config.json"):
        inspect_checkpoint(tmp_path)


def test_a_sentencepiece_tokenizer_in_the_checkpoint_is_used(tmp_path, ckpt):
    path = openpi_checkpoint(tmp_path / "ck", ckpt, None, tokenizer=False)
    model = train_sentencepiece(tmp_path / "sp")
    (path / "paligemma_tokenizer.model").write_bytes(model.read_bytes())
    assert inspect_checkpoint(path).tokenizer_file.name == "paligemma_tokenizer.model"


def test_a_path_that_is_not_there_says_so(tmp_path):
    with pytest.raises(CheckpointError, match=r"nowhere: no such directory \(expected a pi0.5"):
        inspect_checkpoint(tmp_path / "nowhere")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="model.safetensors: not a directory .*holds config.json"):
        inspect_checkpoint(tmp_path / "model.safetensors")


def test_without_a_required_tokenizer_everything_else_is_found(tmp_path, ckpt, monkeypatch):
    """LeRobot saves no tokenizer: `checkpoint info` still shows the rest, then names what is missing."""
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "nothing"))
    path = lerobot_checkpoint(tmp_path / "ck", ckpt, {"observation.state": STATE, "action": ACTION}, tokenizer=False)
    layout = inspect_checkpoint(path, tokenizer_required=False)
    assert layout.tokenizer_file is None and layout.kind == "lerobot" and layout.normalization is not None
    assert layout.tokenizer_missing.startswith(f"no tokenizer found (tried {path / 'tokenizer.model'}, ")
    assert str(tmp_path / "nothing" / "big_vision" / "paligemma_tokenizer.model") in layout.tokenizer_missing
    assert "tokenizer: NONE FOUND (prompt budget 200 tokens)" in describe(layout)
