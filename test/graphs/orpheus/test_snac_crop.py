"""Receptive-field cropping: ``SnacDecoder.decode_range`` == ``decode(...)[..., start:end]``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("snac")  # write_tiny_snac builds the checkpoint with the reference package

from mstar.graph.node import NodeCall  # noqa: E402
from mstar_graphs.orpheus.snac_crop import CropUnsupported, plan_crop, run_crop  # noqa: E402
from mstar_graphs.orpheus.snac_decoder import SnacDecoder  # noqa: E402
from mstar_graphs.orpheus.snac_layers import ResidualUnit, WNConv  # noqa: E402
from mstar_graphs.orpheus.snac_stage import OrpheusSnacStage  # noqa: E402
from mstar_graphs.orpheus.tiny_snac import write_tiny_snac  # noqa: E402

ATOL = 1e-5
RANGES = [(2048, 4096), (0, 2048), (6144, 8192), (1000, 5000)]


def _inputs(model: SnacDecoder, batch: int, frames: int, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    codes = [torch.randint(0, 4096, (batch, frames * s), generator=gen) for s in (1, 2, 4)]
    return codes, model.make_noise(gen, batch, frames * 4)


def _check(model: SnacDecoder, batch: int, ranges: list[tuple[int, int]], frames: int = 4, seed: int = 0) -> None:
    codes, noise = _inputs(model, batch, frames, seed)
    with torch.inference_mode():
        full = model.decode(codes, noise)
        assert full.abs().max() > 0.05, "audio is ~silent; the test would prove nothing"
        for start, end in ranges:
            assert model.crop_plan(frames * 4, start, end) is not None
            part = model.decode_range(codes, noise, start, end)
            assert part.shape == (batch, 1, end - start)
            torch.testing.assert_close(part, full[..., start:end], atol=ATOL, rtol=0, msg=f"range {start}:{end}")


def _load(directory: Path, preset: str = "tiny", overrides: dict | None = None) -> SnacDecoder:
    return SnacDecoder.from_pretrained_dir(write_tiny_snac(directory, preset, overrides=overrides), progress=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> SnacDecoder:
    return _load(tmp_path_factory.mktemp("snac_crop_tiny"))


@pytest.mark.parametrize("batch", [1, 3])
def test_tiny_crop_equals_full(tiny: SnacDecoder, batch: int) -> None:
    edges = [(0, 1), (8191, 8192), (0, 8192), (4095, 4097)]
    _check(tiny, batch, RANGES + edges)


def test_tiny_crop_longer_window(tiny: SnacDecoder) -> None:
    _check(tiny, 2, [(2048, 4096), (0, 3000), (11000, 12288)], frames=6, seed=1)


def test_crop_saves_work(tiny: SnacDecoder) -> None:
    plan = tiny.crop_plan(16, 2048, 4096)
    assert plan is not None
    # The last decoder block (the most expensive activations) runs on ~a quarter of the window.
    assert max(plan.work_fraction()[-8:]) < 0.3


@pytest.mark.parametrize(
    "overrides",
    [
        {"attn_window_size": 4, "decoder_dim": 128},  # local attention: crops round out to whole windows
        {"depthwise": False, "noise": False},
        {"decoder_rates": [3, 5, 2, 7]},  # odd strides: transposed convs with output_padding
    ],
    ids=["attention", "dense-no-noise", "odd-strides"],
)
@pytest.mark.parametrize("batch", [1, 3])
def test_variant_configs(tmp_path: Path, overrides: dict, batch: int) -> None:
    model = _load(tmp_path, overrides=overrides)
    total = model.num_samples(16)
    ranges = [(0, 1), (total // 4, total // 2), (total // 3, total - 5), (total - 100, total)]
    _check(model, batch, ranges)


def test_bench_preset_one_window(tmp_path: Path) -> None:
    model = _load(tmp_path, "bench")
    _check(model, 1, RANGES)


def test_unsupported_layer_falls_back(tiny: SnacDecoder) -> None:
    model = copy.deepcopy(tiny)
    model._crop_plans.clear()
    model.decoder.model.insert(len(model.decoder.model) - 1, nn.Hardtanh(-2.0, 2.0))  # no cropping rule
    with pytest.raises(CropUnsupported):
        plan_crop(model.decoder.model, 16, 2048, 4096)
    codes, noise = _inputs(model, 2, 4, 3)
    with torch.inference_mode():
        part = model.decode_range(codes, noise, 2048, 4096)
        full = model.decode(codes, noise)
    assert model.crop_plan(16, 2048, 4096) is None
    torch.testing.assert_close(part, full[..., 2048:4096], atol=0, rtol=0)


def test_decode_range_validates(tiny: SnacDecoder) -> None:
    codes, noise = _inputs(tiny, 1, 4, 0)
    for start, end in [(-1, 10), (10, 10), (0, 8193)]:
        with pytest.raises(ValueError, match="outside"):
            tiny.decode_range(codes, noise, start, end)
    with pytest.raises(ValueError, match="noise"):
        tiny.decode_range(codes, None, 0, 10)


def _random_conv(gen: torch.Generator, cin: int, cout: int, k: int, **kw: int | bool) -> WNConv:
    conv = WNConv(cin, cout, k, **kw)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    conv.fold()
    return conv


@pytest.mark.parametrize(
    "layers",
    [
        # transposed conv whose kernel is shorter than its stride: some outputs get only the bias
        lambda g: [_random_conv(g, 3, 2, 2, stride=4, padding=1, output_padding=3, transposed=True)],
        lambda g: [_random_conv(g, 3, 4, 5, stride=2, padding=3, dilation=2)],  # strided, dilated conv
        lambda g: [ResidualUnit(3, dilation=2, kernel=5), _random_conv(g, 3, 1, 3, padding=1)],
    ],
    ids=["short-transposed", "strided-dilated", "residual-k5"],
)
def test_layer_geometry(layers) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(4)
    model = nn.ModuleList(layers(gen))
    for module in model.modules():
        if isinstance(module, ResidualUnit):
            for conv in module.modules():
                if isinstance(conv, WNConv):
                    with torch.no_grad():
                        for p in conv.parameters():
                            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(2, 3, 23, generator=gen)
    with torch.inference_mode():
        full = x
        for layer in model:
            full = layer(full)
        n = full.shape[-1]
        for start in range(n):
            for end in (start + 1, min(n, start + 4), n):
                plan = plan_crop(model, 23, start, end)
                torch.testing.assert_close(run_crop(plan, x, None), full[..., start:end], atol=ATOL, rtol=0)


def test_stage_crop_equals_full_path(tiny: SnacDecoder) -> None:
    gen = torch.Generator().manual_seed(6)
    calls = []
    for i in range(3):
        tokens = (torch.randint(0, 4096, (4, 7), generator=gen) + 128266 + torch.arange(7) * 4096).reshape(-1)
        calls.append(NodeCall(f"r{i}", {"codes": tokens}, index=i, seed=11))
    for keep in RANGES:
        cropped = OrpheusSnacStage(tiny, keep_start=keep[0], keep_end=keep[1])
        full = OrpheusSnacStage(tiny, keep_start=keep[0], keep_end=keep[1], crop=False)
        assert cropped.crop and not full.crop
        batch = cropped.prepare_inputs(calls)
        a, b = cropped(**batch)["audio"], full(**batch)["audio"]
        assert a.shape == b.shape == (3, keep[1] - keep[0]) and a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_stage_from_pretrained_dir_crop_flag(tmp_path: Path) -> None:
    path = write_tiny_snac(tmp_path, "tiny")
    assert OrpheusSnacStage.from_pretrained_dir(path, progress=False).crop
    assert not OrpheusSnacStage.from_pretrained_dir(path, progress=False, crop=False).crop
