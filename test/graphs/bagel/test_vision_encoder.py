"""BagelVisionEncoder: patch rows and ids, connector + sin-cos rows, loading from ema.safetensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from mstar.weights import WeightsError
from mstar_graphs.bagel.vision_encoder import BagelVisionEncoder
from mstar_graphs.bagel.vit_config import VitConfig
from support.bagel_vision import LLM_HIDDEN, VIT_GRID, write_tiny_vision_dir


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_vision_dir(tmp_path_factory.mktemp("bagel_vision"))


@pytest.fixture(scope="module")
def encoder(ckpt) -> BagelVisionEncoder:
    return BagelVisionEncoder.from_pretrained_dir(ckpt, None, LLM_HIDDEN, VIT_GRID)


def test_patchify_rows_and_ids(encoder):
    p = encoder.patch_size
    image = torch.randn(3, 2 * p, 3 * p, generator=torch.Generator().manual_seed(0))
    rows, ids = encoder.patchify(image)
    assert rows.shape == (6, 3 * p * p)
    assert ids.tolist() == [0, 1, 2, VIT_GRID, VIT_GRID + 1, VIT_GRID + 2]
    for i, j, py, px, c in [(0, 0, 0, 0, 0), (1, 2, 13, 5, 2), (0, 1, 7, 0, 1), (1, 0, 3, 13, 0)]:
        assert rows[i * 3 + j, (py * p + px) * 3 + c] == image[c, i * p + py, j * p + px]
    with pytest.raises(ValueError, match="multiples of 14"):
        encoder.patchify(torch.zeros(3, 20, 28))
    with pytest.raises(ValueError, match=f"at most {VIT_GRID} per side"):
        encoder.patchify(torch.zeros(3, 14, 14 * (VIT_GRID + 1)))


@torch.no_grad()
def test_rows_are_connector_plus_sincos(encoder, ckpt):
    p = encoder.patch_size
    image = torch.rand(3, 3 * p, 2 * p, generator=torch.Generator().manual_seed(1)) * 2 - 1
    (out,) = encoder([image])
    rows, ids = encoder.patchify(image)
    feats = encoder.vit_model(rows, ids, [rows.shape[0]])
    ema = load_file(str(ckpt / "ema.safetensors"))
    hidden = F.gelu(F.linear(feats, ema["connector.fc1.weight"], ema["connector.fc1.bias"]), approximate="tanh")
    expected = F.linear(hidden, ema["connector.fc2.weight"], ema["connector.fc2.bias"])
    expected = expected + ema["vit_pos_embed.pos_embed"][ids]
    assert out.shape == (6, LLM_HIDDEN)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_several_images_equal_single_calls(encoder):
    p = encoder.patch_size
    gen = torch.Generator().manual_seed(2)
    images = [torch.rand(3, h * p, w * p, generator=gen) * 2 - 1 for h, w in [(2, 3), (6, 6), (1, 1)]]
    together = encoder(images)
    assert [o.shape[0] for o in together] == [6, 36, 1]
    for image, out in zip(images, together):
        torch.testing.assert_close(out, encoder([image])[0], rtol=1e-5, atol=1e-5)


def test_load_errors_name_the_tensors(ckpt, tmp_path):
    ema = load_file(str(ckpt / "ema.safetensors"))
    del ema["connector.fc2.bias"]
    ema["connector.fc3.weight"] = torch.zeros(1)
    ema["language_model.model.norm.weight"] = torch.zeros(4)  # another part's tensor: skipped
    save_file(ema, str(tmp_path / "ema.safetensors"))
    cfg = VitConfig.from_dir(ckpt)
    with pytest.raises(WeightsError) as err:
        BagelVisionEncoder.from_pretrained_dir(tmp_path, cfg, LLM_HIDDEN, VIT_GRID)
    assert "connector.fc2.bias" in str(err.value) and "connector.fc3.weight" in str(err.value)
    assert "language_model" not in str(err.value)
    with pytest.raises(ValueError, match="image_size / patch_size"):
        BagelVisionEncoder(cfg, LLM_HIDDEN, VIT_GRID + 1)
