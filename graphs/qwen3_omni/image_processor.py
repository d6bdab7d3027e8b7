"""The vision encoder's input: an image resized to a multiple of 32 pixels and cut into flat patches.

Qwen3-Omni's processor runs transformers' Qwen2-VL image processor with the released checkpoint's
``preprocessor_config.json`` (patch 16, merge 2, temporal patch 2, 3136 to 12845056 pixels, mean and
std 0.5). This module does the same job without transformers, to the same numbers:

* RGB conversion: transparency is composited onto white (PIL's ``alpha_composite`` for PIL images,
  ``round(a * rgb + (1 - a) * 255)`` for RGBA arrays), grayscale is repeated to three channels;
* size: both sides a multiple of ``patch * merge``, the nearest such size when its area is within
  [min_pixels, max_pixels], else scaled (floor to shrink, ceil to grow) to fit, with Python's
  ``round`` (half to even) as the reference uses; then a PIL resize of the uint8 RGB image (bicubic);
* values: ``float64(x) * rescale_factor`` cast to float32, then ``(x - mean) / std`` in float32;
* layout: one row per patch in merge-block order (block row, block column, then the
  ``merge x merge`` patches of the block row-major), each row ``[C, temporal, patch, patch]`` with
  the single image repeated over the temporal patch, so a 2x2 block is 4 consecutive rows.

Fields missing from a ``preprocessor_config.json`` take the released model's values (not the
Qwen2-VL class defaults transformers would use, which describe a different vision encoder).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import PIL.Image
import torch

MAX_INPUT_PIXELS = 8192 * 8192  # a raw image over this is refused before decoding work (memory guard)
MAX_ASPECT_RATIO = 200  # the reference refuses longer / shorter ratios
CONFIG_FILE = "preprocessor_config.json"

# Qwen/Qwen3-Omni-30B-A3B-Instruct's preprocessor_config.json (the image and the audio front end share
# it). resample, rescale_factor and the do_* switches are absent there: the class defaults apply.
RELEASED_PREPROCESSOR_CONFIG: dict[str, Any] = {
    "chunk_length": 300,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_pixels": 12845056,
    "merge_size": 2,
    "min_pixels": 3136,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "patch_size": 16,
    "processor_class": "Qwen3OmniMoeProcessor",
    "return_attention_mask": True,
    "sampling_rate": 16000,
    "temporal_patch_size": 2,
}

ImageInput = PIL.Image.Image | np.ndarray | torch.Tensor
_RESAMPLE = {int(r): r.name.lower() for r in PIL.Image.Resampling if r <= 5}  # the filters PIL's resize takes


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) -> the size the reference resizes to: multiples of ``factor``, area kept in range."""
    if min(height, width) <= 0:
        raise ValueError(f"image is {width} x {height}: it is empty")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image is {width} x {height}: its aspect ratio {ratio:.1f} is over the limit of "
            f"{MAX_ASPECT_RATIO}; crop or pad it"
        )
    h, w = round(height / factor) * factor, round(width / factor) * factor  # round() is half-to-even, as there
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


def image_pad_count(grid_thw: tuple[int, int, int], merge_size: int = 2) -> int:
    """How many ``<|image_pad|>`` tokens stand for an image of this grid: one per merged block."""
    t, h, w = (int(v) for v in grid_thw)
    if min(t, h, w) <= 0 or merge_size <= 0 or (h * w) % (merge_size * merge_size):
        raise ValueError(f"grid_thw {tuple(grid_thw)} is not a grid of {merge_size} x {merge_size} merge blocks")
    return t * h * w // (merge_size * merge_size)


class _ConfigFile(msgspec.Struct, kw_only=True):
    """The image fields of a preprocessor_config.json as written (None: absent or null)."""

    image_processor_type: str | None = None
    patch_size: int | None = None
    temporal_patch_size: int | None = None
    merge_size: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    size: dict[str, int | None] | None = None  # newer dumps: {"shortest_edge": min, "longest_edge": max}
    image_mean: list[float] | float | None = None
    image_std: list[float] | float | None = None
    rescale_factor: float | None = None
    resample: int | None = None
    do_resize: bool | None = None
    do_rescale: bool | None = None
    do_normalize: bool | None = None
    do_convert_rgb: bool | None = None


class ImagePreprocessor(msgspec.Struct, frozen=True, kw_only=True):
    """Qwen3-Omni's image preprocessing; the defaults are the released checkpoint's."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 12845056
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    resample: int = int(PIL.Image.Resampling.BICUBIC)
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True
    max_input_pixels: int = MAX_INPUT_PIXELS

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name}: {getattr(self, name)!r} {why}")

        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "max_input_pixels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "must be a positive integer")
        if self.max_pixels < self.min_pixels:
            raise bad("max_pixels", f"must be at least min_pixels={self.min_pixels}")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if len(value) != 3 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in value):
                raise bad(name, "must be three finite numbers (R, G, B)")
        if any(v == 0 for v in self.image_std):
            raise bad("image_std", "must not contain 0")
        if not isinstance(self.rescale_factor, (int, float)) or not (0 < self.rescale_factor < math.inf):
            raise bad("rescale_factor", "must be a positive number")
        if isinstance(self.resample, bool) or self.resample not in _RESAMPLE:
            raise bad("resample", f"must be a PIL resampling filter, one of {_RESAMPLE}")
        for name in ("do_rescale", "do_normalize", "do_convert_rgb"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be true or false")

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, max_input_pixels: int = MAX_INPUT_PIXELS, where: str = CONFIG_FILE
    ) -> ImagePreprocessor:
        """The image fields of a preprocessor_config.json's content; other fields (audio) are ignored."""
        try:
            raw = msgspec.convert(data, _ConfigFile)
        except msgspec.ValidationError as err:
            raise ValueError(f"{where}: {err}") from None
        if raw.image_processor_type is not None and not raw.image_processor_type.startswith("Qwen2VLImageProcessor"):
            raise ValueError(
                f"{where}: image_processor_type: {raw.image_processor_type!r} is not the Qwen2-VL "
                "image processor Qwen3-Omni uses"
            )
        if raw.do_resize is False:
            raise ValueError(f"{where}: do_resize: false is not supported (the patch grid needs the resize)")
        fields: dict[str, Any] = {"max_input_pixels": max_input_pixels}
        # as the reference: size's bounds first, then the top-level min_pixels / max_pixels win
        for edge, name in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels")):
            value = getattr(raw, name)
            if value is None and raw.size is not None:
                value = raw.size.get(edge)
            if value is not None:
                fields[name] = value
        for name in ("image_mean", "image_std"):
            value = getattr(raw, name)
            if value is not None:
                fields[name] = tuple(value) if isinstance(value, list) else (value,) * 3
        for name in (
            "patch_size",
            "temporal_patch_size",
            "merge_size",
            "rescale_factor",
            "resample",
            "do_rescale",
            "do_normalize",
            "do_convert_rgb",
        ):
            if getattr(raw, name) is not None:
                fields[name] = getattr(raw, name)
        try:
            return cls(**fields)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None

    @classmethod
    def from_dir(cls, path: str | Path, *, max_input_pixels: int = MAX_INPUT_PIXELS) -> ImagePreprocessor:
        """A checkpoint directory's preprocessor_config.json, or the released values when it has none."""
        file = Path(path) / CONFIG_FILE
        if not file.is_file():
            return cls(max_input_pixels=max_input_pixels)
        try:
            data = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{file}: unreadable: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{file}: must hold a JSON object, got {type(data).__name__}")
        return cls.from_dict(data, max_input_pixels=max_input_pixels, where=str(file))

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: one merge block of patches."""
        return self.patch_size * self.merge_size

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to."""
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """The patch grid of an image of this size, without the image (for counting prompt tokens)."""
        h, w = self.resized_size(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def __call__(self, image: ImageInput) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """An image -> (pixel_values float32 [t*h*w, 3 * temporal * patch * patch], grid (t, h, w))."""
        rgb = self._rgb(image)
        height, width = rgb.shape[:2]
        new_h, new_w = self.resized_size(height, width)
        resized = PIL.Image.fromarray(rgb).resize((new_w, new_h), resample=self.resample)
        x = torch.from_numpy(np.array(resized))  # a writable copy for torch
        # float64 product then float32, as the reference rescales; normalisation is in float32
        x = (x.to(torch.float64) * self.rescale_factor).to(torch.float32) if self.do_rescale else x.to(torch.float32)
        if self.do_normalize:
            x = (x - torch.tensor(self.image_mean, dtype=torch.float32)) / torch.tensor(
                self.image_std, dtype=torch.float32
            )
        return self._patchify(x)

    def _check_size(self, height: int, width: int) -> None:
        if height <= 0 or width <= 0:
            raise ValueError(f"image is {width} x {height}: it is empty")
        if height * width > self.max_input_pixels:
            raise ValueError(
                f"image is {width} x {height} = {width * height} pixels, over the limit of {self.max_input_pixels}"
            )

    def _rgb(self, image: ImageInput) -> np.ndarray:
        """Any accepted image -> uint8 [H, W, 3] (checked before any conversion work)."""
        if isinstance(image, PIL.Image.Image):
            self._check_size(image.height, image.width)
            if not self.do_convert_rgb:
                if image.mode != "RGB":
                    raise ValueError(f"image mode is {image.mode!r}; with do_convert_rgb off it must be 'RGB'")
                return np.asarray(image)
            if "A" in image.getbands() or image.info.get("transparency") is not None:
                white = PIL.Image.new("RGBA", image.size, (255, 255, 255, 255))
                return np.asarray(PIL.Image.alpha_composite(white, image.convert("RGBA")).convert("RGB"))
            return np.asarray(image.convert("RGB"))
        if isinstance(image, torch.Tensor):
            image = image.detach().cpu().numpy()
        if not isinstance(image, np.ndarray):
            raise ValueError(f"image must be a PIL image or a uint8 array [H, W, 3]; got {type(image).__name__}")
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
            raise ValueError(
                f"image array must be [H, W] (gray), [H, W, 1], [H, W, 3] or [H, W, 4] (RGBA), "
                f"channels last; got shape {tuple(image.shape)}"
            )
        self._check_size(image.shape[0], image.shape[1])
        if np.issubdtype(image.dtype, np.floating) and not np.isfinite(image).all():
            raise ValueError("image array contains NaN or infinite values")
        if image.dtype != np.uint8:
            raise ValueError(f"image array must be uint8 (values 0-255); got dtype {image.dtype}")
        channels = 1 if image.ndim == 2 else image.shape[2]
        if channels == 3:
            return image
        if not self.do_convert_rgb:
            raise ValueError(f"image has {channels} channel(s); with do_convert_rgb off it must be RGB")
        if channels == 4:  # onto white, rounded to uint8 as the reference does for arrays
            alpha = image[..., 3:] / 255.0
            return np.round(alpha * image[..., :3] + (1.0 - alpha) * 255.0).astype(np.uint8)
        gray = image if image.ndim == 3 else image[..., None]
        return np.repeat(gray, 3, axis=2)

    def _patchify(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        height, width, channels = x.shape
        gh, gw = height // p, width // p
        blocks = x.reshape(gh // m, m, p, gw // m, m, p, channels)
        # -> (block row, block col, row in block, col in block, C, patch row, patch col)
        blocks = blocks.permute(0, 3, 1, 4, 6, 2, 5)
        # a still image fills every temporal slot of the patch
        blocks = blocks.unsqueeze(5).expand(-1, -1, -1, -1, -1, t, -1, -1)
        return blocks.reshape(gh * gw, channels * t * p * p).contiguous(), (1, gh, gw)


def write_preprocessor_config(directory: str | Path) -> Path:
    """Write the released model's preprocessor_config.json into ``directory``; returns the file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    file = directory / CONFIG_FILE
    file.write_text(json.dumps(RELEASED_PREPROCESSOR_CONFIG, indent=2) + "\n")
    return file
