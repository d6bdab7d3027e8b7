"""Finding and reading checkpoint files, and writing them with save_safetensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from mstar.weights import WeightsError, checkpoint_tensor_names, iter_checkpoint_tensors, save_safetensors


def small_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"a.weight": torch.randn(4, 4), "b.weight": torch.randn(8), "c.index": torch.arange(5)}


def test_iter_yields_every_tensor_in_order(tmp_path):
    state = small_state()
    save_safetensors(state, tmp_path)
    got = list(iter_checkpoint_tensors(tmp_path))
    assert [n for n, _ in got] == list(state)
    for name, tensor in got:
        assert torch.equal(tensor, state[name])
    assert checkpoint_tensor_names(tmp_path / "model.safetensors") == list(state)


def test_sharded_index_iterates_all_shards(tmp_path):
    state = small_state()
    save_safetensors(state, tmp_path, max_shard_bytes=40)
    got = dict(iter_checkpoint_tensors(tmp_path / "model.safetensors.index.json"))
    assert set(got) == set(state)
    assert all(torch.equal(got[n], state[n]) for n in state)


def test_empty_dir_is_a_clear_error(tmp_path):
    with pytest.raises(WeightsError, match="no model.safetensors, \\*.safetensors.index.json or pytorch_model.bin"):
        list(iter_checkpoint_tensors(tmp_path))
    (tmp_path / "vae.safetensors").write_bytes(b"")
    with pytest.raises(WeightsError, match="vae.safetensors"):  # hint at the file that is there
        checkpoint_tensor_names(tmp_path)


def test_missing_path_and_unknown_suffix(tmp_path):
    with pytest.raises(WeightsError, match="does not exist"):
        checkpoint_tensor_names(tmp_path / "nope")
    (tmp_path / "weights.npz").write_bytes(b"")
    with pytest.raises(WeightsError, match="unknown checkpoint file type"):
        checkpoint_tensor_names(tmp_path / "weights.npz")


def test_index_naming_missing_shard(tmp_path):
    files = save_safetensors(small_state(), tmp_path, max_shard_bytes=40)
    gone = files[1]
    gone.unlink()
    with pytest.raises(WeightsError, match=gone.name):
        list(iter_checkpoint_tensors(tmp_path))


def test_index_naming_tensor_absent_from_shard(tmp_path):
    files = save_safetensors(small_state(), tmp_path, max_shard_bytes=40)
    index = json.loads(files[-1].read_text())
    index["weight_map"]["ghost.weight"] = files[0].name
    files[-1].write_text(json.dumps(index))
    with pytest.raises(WeightsError, match="ghost.weight"):
        list(iter_checkpoint_tensors(tmp_path))


def test_bad_index_and_corrupt_file(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(WeightsError, match="weight_map"):
        checkpoint_tensor_names(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match="bad.safetensors"):
        checkpoint_tensor_names(bad)


def test_bin_with_non_tensor_entries(tmp_path):
    torch.save({"w": torch.zeros(2), "step": 3}, tmp_path / "pytorch_model.bin")
    with pytest.raises(WeightsError, match="step"):
        list(iter_checkpoint_tensors(tmp_path))


def test_save_makes_contiguous_and_unshares(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    state = {"whole": base, "rows": base[1:], "t": base.t(), "again": base}
    save_safetensors(state, tmp_path)
    got = dict(iter_checkpoint_tensors(tmp_path))
    for name, tensor in state.items():
        assert torch.equal(got[name], tensor), name


def test_save_metadata_and_stale_files(tmp_path):
    save_safetensors(small_state(), tmp_path, max_shard_bytes=40)
    assert (tmp_path / "model.safetensors.index.json").exists()
    files = save_safetensors(small_state(), tmp_path, metadata={"source": "unit"})
    assert files == [tmp_path / "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # old shards removed
    with safe_open(str(files[0]), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "source": "unit"}
    with pytest.raises(ValueError, match="max_shard_bytes"):
        save_safetensors(small_state(), tmp_path, max_shard_bytes=0)


def test_oversized_tensor_gets_its_own_shard(tmp_path):
    state = {"small": torch.zeros(2), "big": torch.zeros(100), "tail": torch.zeros(2)}
    files = save_safetensors(state, tmp_path, max_shard_bytes=64)
    index = json.loads(files[-1].read_text())["weight_map"]
    assert len(files) == 4  # three shards and the index
    assert len({index["small"], index["big"], index["tail"]}) == 3
