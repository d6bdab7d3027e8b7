"""Loading Orpheus from a directory: bad checkpoints fail clearly, naming what is wrong."""

from __future__ import annotations

import json
import shutil

import pytest

from mstar.weights import WeightsError, iter_checkpoint_tensors, save_safetensors
from mstar_graphs.common.config_loader import ConfigError
from mstar_graphs.orpheus.checkpoints import ensure_tiny_orpheus, resolve_paths
from mstar_graphs.orpheus.frontend import OrpheusTTS


@pytest.fixture()
def copy(tmp_path):
    paths = ensure_tiny_orpheus("tiny")
    shutil.copytree(paths.llm, tmp_path / "llm")
    shutil.copytree(paths.snac, tmp_path / "llm" / "snac")
    return tmp_path / "llm"


def test_real_layout_from_a_path_loads(copy):
    tts = OrpheusTTS.load(copy, progress=False)
    assert tts.paths.llm == copy and tts.paths.snac == copy / "snac"
    assert tts.random_weights  # the copied config still says so


def test_missing_tensor_is_named(copy):
    snac_dir = copy / "snac"
    tensors = dict(iter_checkpoint_tensors(snac_dir))
    victim = next(n for n in tensors if n.startswith("decoder."))
    del tensors[victim]
    for f in snac_dir.glob("*.safetensors"):
        f.unlink()
    save_safetensors(tensors, snac_dir)
    with pytest.raises(WeightsError, match=victim.replace(".", r"\.")):
        OrpheusTTS.load(copy, progress=False)


def test_config_with_a_wrong_field_is_named(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["num_hidden_layers"] = "two"
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        OrpheusTTS.load(copy, progress=False)


def test_missing_directories_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_paths(tmp_path / "nowhere")
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="snac-weights"):
        resolve_paths(tmp_path / "llm")
    with pytest.raises(ValueError, match="unknown Orpheus preset"):
        resolve_paths(None, preset="huge")
