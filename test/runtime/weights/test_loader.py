"""load_weights: round trips through every layout, renaming, dtypes, ties and every error kind."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from mstar.weights import LoadReport, WeightsError, checkpoint_tensor_names, load_weights, save_safetensors


class Tiny(nn.Module):
    def __init__(self, seed: int = 0, tie: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 6)
        self.norm = nn.LayerNorm(6)
        self.lm_head = nn.Linear(4, 10, bias=False)
        self.register_buffer("steps", torch.tensor(seed, dtype=torch.long))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)
        if tie:
            self.lm_head.weight = self.embed.weight


def assert_same(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def test_single_file_round_trip(tmp_path):
    src, dst = Tiny(seed=1), Tiny(seed=2)
    files = save_safetensors(src.state_dict(), tmp_path)
    assert files == [tmp_path / "model.safetensors"]
    report = load_weights(dst, tmp_path, progress=False)
    assert_same(src, dst)
    assert isinstance(report, LoadReport)
    assert report.loaded == len(src.state_dict()) == 7
    assert report.skipped == [] and report.missing == [] and report.unexpected == []
    assert report.bytes == sum(t.nbytes for t in src.state_dict().values())
    assert report.seconds >= 0
    # The file itself is a valid path too.
    load_weights(Tiny(seed=3), files[0], progress=False)


def test_sharded_round_trip(tmp_path):
    src, dst = Tiny(seed=1), Tiny(seed=2)
    files = save_safetensors(src.state_dict(), tmp_path, max_shard_bytes=100, metadata={"who": "test"})
    shards = [f for f in files if f.name.endswith(".safetensors")]
    assert len(shards) >= 3
    assert files[-1] == tmp_path / "model.safetensors.index.json"
    assert not (tmp_path / "model.safetensors").exists()
    index = json.loads(files[-1].read_text())
    assert set(index["weight_map"]) == set(src.state_dict())
    assert set(index["weight_map"].values()) == {f.name for f in shards}
    assert shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in src.state_dict().values())
    assert index["metadata"]["who"] == "test"

    report = load_weights(dst, tmp_path, progress=False)
    assert_same(src, dst)
    assert report.loaded == 7
    assert sorted(checkpoint_tensor_names(tmp_path)) == sorted(src.state_dict())


def test_bin_round_trip(tmp_path):
    src, dst = Tiny(seed=1), Tiny(seed=2)
    torch.save(src.state_dict(), tmp_path / "pytorch_model.bin")
    report = load_weights(dst, tmp_path, progress=False)
    assert_same(src, dst)
    assert report.loaded == 7
    load_weights(Tiny(seed=3), tmp_path / "pytorch_model.bin", progress=False)


def test_name_map_renames_and_skips(tmp_path):
    src, dst = Tiny(seed=1), Tiny(seed=2)
    ckpt = {f"model.{k}": v for k, v in src.state_dict().items()}
    ckpt["vision.patch.weight"] = torch.ones(2, 2)
    save_safetensors(ckpt, tmp_path)

    def name_map(name: str) -> str | None:
        return None if name.startswith("vision.") else name.removeprefix("model.")

    report = load_weights(dst, tmp_path, name_map=name_map, progress=False)
    assert_same(src, dst)
    assert report.skipped == ["vision.patch.weight"]
    assert report.loaded == 7


def test_bf16_checkpoint_into_fp32_module(tmp_path):
    src = Tiny(seed=1)
    save_safetensors(
        {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in src.state_dict().items()}, tmp_path
    )
    dst = Tiny(seed=2)
    load_weights(dst, tmp_path, progress=False)
    assert dst.proj.weight.dtype == torch.float32
    assert torch.equal(dst.proj.weight, src.proj.weight.to(torch.bfloat16).float())
    assert not torch.equal(dst.proj.weight, src.proj.weight)  # the values really went through bf16


def test_dtype_argument_converts_floating_targets(tmp_path):
    src = Tiny(seed=1, tie=True)
    save_safetensors(src.state_dict(), tmp_path)
    dst = Tiny(seed=2, tie=True)
    weight = dst.proj.weight
    load_weights(dst, tmp_path, dtype=torch.bfloat16, progress=False)
    assert dst.proj.weight is weight  # same Parameter object, re-typed in place
    for name, t in dst.state_dict().items():
        expected = torch.long if name == "steps" else torch.bfloat16
        assert t.dtype == expected, name
    assert torch.equal(dst.proj.weight, src.proj.weight.to(torch.bfloat16))
    assert dst.lm_head.weight is dst.embed.weight
    assert dst.steps.item() == 1
    with pytest.raises(ValueError, match="floating"):
        load_weights(dst, tmp_path, dtype=torch.int32, progress=False)


def test_missing_tensor_raises_and_leaves_module_untouched(tmp_path):
    ckpt = Tiny(seed=1).state_dict()
    del ckpt["proj.bias"]
    save_safetensors(ckpt, tmp_path)
    dst = Tiny(seed=2)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(WeightsError, match=r"proj\.bias") as err:
        load_weights(dst, tmp_path, progress=False)
    assert "missing" in str(err.value)
    for name, t in dst.state_dict().items():
        assert torch.equal(t, before[name]), name


def test_unexpected_tensor_raises(tmp_path):
    ckpt = Tiny(seed=1).state_dict()
    ckpt["extra.weight"] = torch.zeros(2)
    save_safetensors(ckpt, tmp_path)
    with pytest.raises(WeightsError, match=r"unexpected[\s\S]*extra\.weight"):
        load_weights(Tiny(), tmp_path, progress=False)


def test_mis_shaped_tensor_names_both_shapes(tmp_path):
    ckpt = Tiny(seed=1).state_dict()
    ckpt["proj.weight"] = torch.zeros(5, 4)
    save_safetensors(ckpt, tmp_path)
    with pytest.raises(WeightsError) as err:
        load_weights(Tiny(), tmp_path, progress=False)
    assert "proj.weight: checkpoint (5, 4) vs model (6, 4)" in str(err.value)
    assert "missing" not in str(err.value)  # reported once, as mis-shaped
    # Shape mismatches stay errors without strict.
    with pytest.raises(WeightsError, match=r"proj\.weight"):
        load_weights(Tiny(), tmp_path, strict=False, progress=False)


def test_all_problems_reported_together(tmp_path):
    ckpt = Tiny(seed=1).state_dict()
    del ckpt["norm.bias"]
    ckpt["ghost"] = torch.zeros(1)
    ckpt["proj.bias"] = torch.zeros(7)
    save_safetensors(ckpt, tmp_path)
    with pytest.raises(WeightsError) as err:
        load_weights(Tiny(), tmp_path, progress=False)
    msg = str(err.value)
    assert "norm.bias" in msg and "ghost" in msg and "proj.bias: checkpoint (7) vs model (6)" in msg


def test_strict_false_reports_instead(tmp_path, caplog):
    src = Tiny(seed=1)
    ckpt = src.state_dict()
    del ckpt["proj.bias"]
    ckpt["extra.weight"] = torch.zeros(2)
    save_safetensors(ckpt, tmp_path)
    dst = Tiny(seed=2)
    bias = dst.proj.bias.clone()
    with caplog.at_level(logging.WARNING, logger="mstar.weights"):
        report = load_weights(dst, tmp_path, strict=False, progress=False)
    assert report.missing == ["proj.bias"]
    assert report.unexpected == ["extra.weight"]
    assert report.loaded == 6
    assert torch.equal(dst.proj.bias, bias)
    assert torch.equal(dst.proj.weight, src.proj.weight)
    assert "proj.bias" in caplog.text and "extra.weight" in caplog.text


def test_tied_weights_load_from_either_name(tmp_path):
    src = Tiny(seed=1, tie=True)
    ckpt = src.state_dict()
    assert "lm_head.weight" in ckpt  # state_dict lists the tied tensor under both names
    del ckpt["lm_head.weight"]
    save_safetensors(ckpt, tmp_path / "embed_only")
    dst = Tiny(seed=2, tie=True)
    report = load_weights(dst, tmp_path / "embed_only", progress=False)
    assert report.missing == []
    assert dst.lm_head.weight is dst.embed.weight
    assert torch.equal(dst.lm_head.weight, src.embed.weight)

    # Only the other name, and both names (shared storage is cloned on save), also load.
    only_head = {k: v for k, v in src.state_dict().items() if k != "embed.weight"}
    save_safetensors(only_head, tmp_path / "head_only")
    load_weights(Tiny(seed=3, tie=True), tmp_path / "head_only", progress=False)
    save_safetensors(src.state_dict(), tmp_path / "both")
    dst = Tiny(seed=4, tie=True)
    assert load_weights(dst, tmp_path / "both", progress=False).loaded == 7
    assert torch.equal(dst.embed.weight, src.embed.weight)


def test_tied_group_missing_is_named(tmp_path):
    ckpt = Tiny(seed=1, tie=True).state_dict()
    del ckpt["lm_head.weight"], ckpt["embed.weight"]
    save_safetensors(ckpt, tmp_path)
    with pytest.raises(WeightsError, match=r"embed\.weight \(tied with lm_head\.weight\)"):
        load_weights(Tiny(tie=True), tmp_path, progress=False)


def test_long_lists_are_truncated(tmp_path):
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(15))

    save_safetensors({"layers.0.weight": torch.zeros(2, 2)}, tmp_path)
    with pytest.raises(WeightsError) as err:
        load_weights(Wide(), tmp_path, progress=False)
    msg = str(err.value)
    assert "29 missing" in msg
    assert "... and 19 more" in msg
    assert "layers.14.bias" not in msg


def test_progress_bar_and_log_line(tmp_path, capsys, caplog):
    save_safetensors(Tiny(seed=1).state_dict(), tmp_path)
    with caplog.at_level(logging.INFO, logger="mstar.weights"):
        load_weights(Tiny(), tmp_path, desc="loading llm weights")
    assert "loading llm weights" in capsys.readouterr().err
    assert "loaded 7 tensors" in caplog.text
    load_weights(Tiny(), tmp_path, progress=False, desc="quiet please")
    assert "quiet please" not in capsys.readouterr().err


def test_meta_module_is_refused(tmp_path):
    save_safetensors(Tiny(seed=1).state_dict(), tmp_path)
    with torch.device("meta"):
        meta = Tiny()
    with pytest.raises(WeightsError, match="meta device"):
        load_weights(meta, tmp_path, progress=False)
