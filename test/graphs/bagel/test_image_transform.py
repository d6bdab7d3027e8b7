"""BAGEL's resize rule against hand-computed sizes, the pixel path, and transparency over white."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mstar_graphs.bagel.image_transform import ImageTransform, resized_size, rgb_on_white, to_unit_range

VIT = (980, 224, 14)
VAE = (1024, 512, 16)


@pytest.mark.parametrize(
    ("size", "rule", "expected"),
    [
        ((640, 480), VIT, (644, 476)),  # no scaling; 45.71 -> 46 strides, 34.29 -> 34
        ((2000, 1000), VIT, (980, 490)),  # landscape, long side to 980
        ((1000, 3000), VIT, (322, 980)),  # portrait: 326.67 -> 327 -> 23 strides
        ((50, 30), VIT, (378, 224)),  # tiny: short side up to 224; 373.3 -> 373 -> 27 strides
        ((640, 480), VAE, (688, 512)),  # short side up to 512: 682.67 -> 683 -> 42.69 -> 43 strides
        ((100, 1000), (500, 224, 16), (48, 496)),  # min-size growth overshoots; the long-side pass snaps back
        ((35, 490), (1000, 10, 14), (28, 490)),  # 35 / 14 = 2.5 rounds to even 2 (half-up would say 42)
        ((49, 490), (1000, 10, 14), (56, 490)),  # 3.5 rounds to even 4
        ((1962, 101), (981, 1, 1), (981, 50)),  # 101 * 0.5 = 50.5 rounds to even 50
    ],
)
def test_resize_rule(size, rule, expected):
    assert resized_size(*size, *rule) == expected
    assert ImageTransform(*rule).size_for(*size) == expected


def test_max_pixels_scales_by_area_ratio():
    # 200 x 200 = 40000 > 10000: the reference scales each side by 10000/40000 (not its square root)
    assert resized_size(200, 200, 1000, 10, 10, max_pixels=10_000) == (50, 50)


def test_bad_sizes():
    with pytest.raises(ValueError, match="width"):
        resized_size(0, 10, *VIT)
    with pytest.raises(ValueError, match="stride"):
        ImageTransform(980, 224, 0)


def test_pixels_resized_bicubic_and_scaled_to_unit_range():
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (30, 50, 3), dtype=np.uint8))
    out = ImageTransform(*VIT)(image)
    assert out.shape == (3, 224, 378) and out.dtype == torch.float32
    direct = np.asarray(image.resize((378, 224), Image.BICUBIC)).astype(np.float32) / 255
    torch.testing.assert_close(out, torch.from_numpy((direct - 0.5) / 0.5).permute(2, 0, 1), rtol=0, atol=1e-6)
    edges = to_unit_range(torch.tensor([[[0, 255, 128]]], dtype=torch.uint8))
    assert edges.flatten().tolist() == pytest.approx([-1.0, 1.0, (128 / 255 - 0.5) / 0.5], abs=1e-6)


def test_conforming_image_not_resized():
    image = Image.new("RGB", (644, 476), (1, 2, 3))
    assert ImageTransform(*VIT).resize(image) is image


def test_transparency_over_white():
    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 0)  # fully transparent -> white
    rgba[0, 1] = (10, 20, 30, 255)  # opaque -> itself
    rgba[1, 0] = (0, 0, 0, 128)  # half -> grey
    out = np.asarray(rgb_on_white(Image.fromarray(rgba, "RGBA")))
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [10, 20, 30]
    assert 120 <= out[1, 0, 0] <= 135

    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([200, 0, 0, 0, 0, 200] + [0] * 762)
    palette.putpixel((1, 0), 1)
    palette.info["transparency"] = 1  # palette entry 1 is transparent
    assert np.asarray(rgb_on_white(palette)).tolist() == [[[200, 0, 0], [255, 255, 255]]]
    assert rgb_on_white(Image.new("L", (1, 1), 7)).getpixel((0, 0)) == (7, 7, 7)
    with pytest.raises(ValueError, match="RGB"):
        to_unit_range(Image.new("RGBA", (1, 1)))
