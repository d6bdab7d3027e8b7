"""Qwen3-Omni image preprocessing: transformers' Qwen2-VL PIL image processor's numbers and layout, clear refusals."""

from __future__ import annotations

import json

import numpy as np
import PIL.Image
import pytest
import torch

from mstar_graphs.qwen3_omni.image_processor import (
    MAX_INPUT_PIXELS,
    RELEASED_PREPROCESSOR_CONFIG,
    ImagePreprocessor,
    image_pad_count,
    smart_resize,
    write_preprocessor_config,
)

RELEASED = dict(
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    min_pixels=3136,
    max_pixels=12845056,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)


@pytest.fixture(scope="module")
def qwen2vl():
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    return pil


def reference(module, image, **settings):
    processor = module.Qwen2VLImageProcessorPil(**{**RELEASED, **settings})
    extra = {} if isinstance(image, PIL.Image.Image) else {"input_data_format": "channels_last"}
    out = processor(images=image, return_tensors="np", **extra)
    return out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])


def random_image(height, width, channels, seed=0):
    shape = (height, width) if channels == 0 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def assert_same(ours, ref):
    (values, grid), (ref_values, ref_grid) = ours, ref
    assert grid == ref_grid
    assert values.dtype == torch.float32 and values.shape == ref_values.shape
    assert float((values - torch.from_numpy(ref_values)).abs().max()) < 1e-6


# (width, height, channels; 0: an [H, W] array), then settings
CASES = [
    ((64, 48, 3), {}),
    ((333, 500, 3), {}),
    ((1000, 37, 3), {}),
    ((48, 80, 3), {}),  # 48 / 32 = 1.5 and 80 / 32 = 2.5: round half to even
    ((17, 17, 1), {}),  # gray, grown to the minimum area
    ((50, 40, 4), {}),  # RGBA onto white
    ((400, 300, 3), {"max_pixels": 32 * 32 * 20}),  # shrunk to the maximum area
    ((64, 96, 3), {"resample": 2, "merge_size": 1, "temporal_patch_size": 1}),
]


@pytest.mark.parametrize("size, settings", CASES, ids=[f"{w}x{h}x{c}-{len(s)}" for (w, h, c), s in CASES])
def test_the_reference_numbers_and_layout(qwen2vl, size, settings):
    width, height, channels = size
    image = random_image(height, width, channels)
    ours = ImagePreprocessor(**{k: tuple(v) if isinstance(v, list) else v for k, v in {**RELEASED, **settings}.items()})
    values, grid = ours(image)
    assert_same((values, grid), reference(qwen2vl, image, **settings))
    assert ours.grid_thw(height, width) == grid and values.shape[0] == grid[0] * grid[1] * grid[2]


@pytest.mark.parametrize("mode", ["L", "RGBA", "LA", "RGB"])
def test_pil_images_convert_as_the_reference_does(qwen2vl, mode):
    channels = {"L": 0, "RGBA": 4, "LA": 0, "RGB": 3}[mode]
    image = PIL.Image.fromarray(random_image(21, 45, channels, seed=3))
    if mode == "LA":
        image = image.convert("LA")
        image.putalpha(PIL.Image.fromarray(random_image(21, 45, 0, seed=4)))
    assert_same(ImagePreprocessor()(image), reference(qwen2vl, image))


def test_a_gray_array_is_the_gray_image():
    gray = random_image(17, 17, 0, seed=5)
    a, b, c = (ImagePreprocessor()(x) for x in (gray, gray[..., None], PIL.Image.fromarray(gray)))
    assert a[1] == b[1] == c[1] == (1, 4, 4) and torch.equal(a[0], b[0]) and torch.equal(a[0], c[0])


def test_smart_resize_matches_on_many_sizes(qwen2vl):
    rng = np.random.default_rng(1)
    for height, width in rng.integers(1, 5000, (300, 2)).tolist() + [[1, 1], [31, 17], [16, 3200], [3584, 3584]]:
        if max(height, width) / min(height, width) > 200:
            continue
        for lo, hi in ((3136, 12845056), (256 * 32 * 32, 1280 * 32 * 32)):
            assert smart_resize(height, width, 32, lo, hi) == qwen2vl.smart_resize(height, width, 32, lo, hi)


def test_the_released_config_round_trips(tmp_path, qwen2vl):
    assert ImagePreprocessor.from_dir(tmp_path) == ImagePreprocessor()  # no file: the released values
    file = write_preprocessor_config(tmp_path)
    assert json.loads(file.read_text()) == RELEASED_PREPROCESSOR_CONFIG
    ours = ImagePreprocessor.from_dir(tmp_path)
    assert ours == ImagePreprocessor()
    theirs = qwen2vl.Qwen2VLImageProcessorPil.from_pretrained(str(tmp_path))
    image = random_image(90, 130, 3, seed=2)
    out = theirs(images=image, return_tensors="np", input_data_format="channels_last")
    assert_same(ours(image), (out["pixel_values"], tuple(int(v) for v in out["image_grid_thw"][0])))
    assert ImagePreprocessor.from_dir(tmp_path, max_input_pixels=10).max_input_pixels == 10


def test_size_bounds_and_their_override():
    p = ImagePreprocessor.from_dict({"size": {"shortest_edge": 1024, "longest_edge": 4096}, "min_pixels": None})
    assert (p.min_pixels, p.max_pixels) == (1024, 4096)
    p = ImagePreprocessor.from_dict(
        {
            "size": {"shortest_edge": 1024, "longest_edge": 4096},
            "max_pixels": 8192,
            "image_mean": 0.25,
            "feature_size": 128,
        }
    )
    assert (p.min_pixels, p.max_pixels, p.image_mean) == (1024, 8192, (0.25, 0.25, 0.25))


def test_image_pad_count():
    assert image_pad_count((1, 4, 6), 2) == 6 and image_pad_count(ImagePreprocessor()(random_image(48, 64, 3))[1]) == 4
    with pytest.raises(ValueError, match="merge blocks"):
        image_pad_count((1, 3, 3), 2)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"patch_size": "16"}, "Expected `int | null`, got `str` - at `$.patch_size`"),
        ({"patch_size": 0}, "patch_size: 0 must be a positive integer"),
        ({"resample": 9}, "resample: 9 must be a PIL resampling filter"),
        ({"image_mean": [0.5, 0.5]}, "image_mean: (0.5, 0.5) must be three finite numbers"),
        ({"image_std": [0.5, 0.0, 0.5]}, "image_std: (0.5, 0.0, 0.5) must not contain 0"),
        ({"min_pixels": 5000, "max_pixels": 4000}, "max_pixels: 4000 must be at least min_pixels=5000"),
        ({"rescale_factor": -1.0}, "rescale_factor: -1.0 must be a positive number"),
        ({"do_resize": False}, "do_resize: false is not supported"),
        ({"image_processor_type": "SiglipImageProcessor"}, "image_processor_type: 'SiglipImageProcessor'"),
    ],
)
def test_a_bad_config_field_is_named(tmp_path, data, message):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        ImagePreprocessor.from_dir(tmp_path)
    assert message in str(err.value) and "preprocessor_config.json" in str(err.value)


def test_an_unreadable_config_is_refused(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        ImagePreprocessor.from_dir(tmp_path)


def test_a_big_image_is_downsized_but_one_over_the_cap_is_refused():
    assert MAX_INPUT_PIXELS == 8192 * 8192
    small_max = ImagePreprocessor(max_pixels=64 * 64)
    assert small_max(random_image(400, 400, 3))[1] == (1, 4, 4)  # 400 x 400 down to 64 x 64
    capped = ImagePreprocessor(max_input_pixels=1000)
    with pytest.raises(ValueError, match=r"image is 30 x 40 = 1200 pixels, over the limit of 1000"):
        capped(random_image(40, 30, 3))
    with pytest.raises(ValueError, match=r"image is 30 x 40 = 1200 pixels, over the limit of 1000"):
        capped(PIL.Image.new("RGB", (30, 40)))


@pytest.mark.parametrize(
    "image, message",
    [
        (np.zeros((2, 1000, 3), np.uint8), "image is 1000 x 2: its aspect ratio 500.0 is over the limit of 200"),
        (np.zeros((0, 10, 3), np.uint8), "image is 10 x 0: it is empty"),
        (PIL.Image.new("RGB", (0, 5)), "image is 0 x 5: it is empty"),
        (np.zeros((40, 50, 3), np.float32), "image array must be uint8 (values 0-255); got dtype float32"),
        (np.full((40, 50, 3), np.nan, np.float32), "image array contains NaN or infinite values"),
        (np.zeros((3, 40, 50), np.uint8), "channels last; got shape (3, 40, 50)"),
        (np.zeros((40, 50, 2), np.uint8), "got shape (40, 50, 2)"),
        (np.zeros((1, 40, 50, 3), np.uint8), "got shape (1, 40, 50, 3)"),
        ("cat.png", "image must be a PIL image or a uint8 array [H, W, 3]; got str"),
    ],
)
def test_bad_images_are_refused_clearly(image, message):
    with pytest.raises(ValueError) as err:
        ImagePreprocessor()(image)
    assert message in str(err.value)


def test_the_reference_refuses_the_same_aspect_ratio(qwen2vl):
    with pytest.raises(ValueError, match="aspect ratio"):
        reference(qwen2vl, np.zeros((2, 1000, 3), np.uint8))


def test_a_uint8_tensor_is_an_array():
    image = random_image(48, 64, 3, seed=6)
    a, b = ImagePreprocessor()(image), ImagePreprocessor()(torch.from_numpy(image))
    assert a[1] == b[1] and torch.equal(a[0], b[0])
