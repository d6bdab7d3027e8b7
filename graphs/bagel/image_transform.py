"""BAGEL's image preprocessing: the resize rule of ``data/transforms.py`` and the [-1, 1] tensor.

``resized_size`` is the rule alone (no pixels), so a front end can check an image's size before
decoding it. The rule, per ``ImageTransform(max_size, min_size, stride, max_pixels)``:

1. scale = min(max_size / long side, 1), then at least min_size / short side (small images grow);
2. each side -> round(side * scale) (Python's round: half to even), then to a multiple of
   ``stride`` (round(side / stride) * stride, at least one stride);
3. if the area is over ``max_pixels``, scale both sides by the AREA ratio (not its square root,
   as the reference does) and snap again; then if the long side is over ``max_size``, scale it
   down to ``max_size`` and snap again.

Pixels are resized with PIL's bicubic filter (what torchvision's ``F.resize`` does on a PIL
image; PIL always antialiases), then scaled to [0, 1] (/255) and normalised with mean = std = 0.5.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

DEFAULT_MAX_PIXELS = 14 * 14 * 9 * 1024  # the reference's default; never reached by 980 or 1024 px sides


def _snap(value: float, stride: int) -> int:
    return max(stride, int(round(value / stride) * stride))


def _scaled(width: int, height: int, scale: float, stride: int) -> tuple[int, int]:
    return _snap(round(width * scale), stride), _snap(round(height * scale), stride)


def resized_size(
    width: int, height: int, max_size: int, min_size: int, stride: int, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[int, int]:
    """(width, height) an image of ``width`` x ``height`` pixels is resized to; both are multiples of ``stride``."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"image {name} must be a positive integer, got {value!r}")
    scale = min(max_size / max(width, height), 1.0)
    scale = max(scale, min_size / min(width, height))
    new_w, new_h = _scaled(width, height, scale, stride)
    if new_w * new_h > max_pixels:
        new_w, new_h = _scaled(new_w, new_h, max_pixels / (new_w * new_h), stride)
    if max(new_w, new_h) > max_size:
        new_w, new_h = _scaled(new_w, new_h, max_size / max(new_w, new_h), stride)
    return new_w, new_h


def rgb_on_white(image: Image.Image) -> Image.Image:
    """An RGB copy of ``image``, as the reference's ``pil_img2rgb`` makes it: RGBA images, and images
    whose ``info`` names a transparent colour (P or L with ``transparency``), are laid over white;
    every other mode is converted as is (an LA image's alpha is dropped, as the reference drops it)."""
    if image.mode == "RGBA" or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def to_unit_range(image: Image.Image | np.ndarray | torch.Tensor) -> torch.Tensor:
    """RGB PIL image or uint8 [H, W, 3] -> float32 [3, H, W] in [-1, 1]: (x / 255 - 0.5) / 0.5."""
    if isinstance(image, Image.Image):
        if image.mode != "RGB":
            raise ValueError(f"expected an RGB image, got mode {image.mode!r} (use rgb_on_white first)")
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8, copy=True))
    else:
        pixels = torch.as_tensor(image)
    if pixels.dtype != torch.uint8 or pixels.dim() != 3 or pixels.shape[-1] != 3:
        raise ValueError(f"expected uint8 [H, W, 3] pixels, got {pixels.dtype} {tuple(pixels.shape)}")
    unit = pixels.permute(2, 0, 1).contiguous().to(torch.float32).div(255)
    return (unit - 0.5) / 0.5  # torchvision's Normalize(0.5, 0.5), in the same order of operations


class ImageTransform:
    """``ImageTransform(max_size, min_size, stride)`` of the reference: PIL image -> [3, H, W] in [-1, 1],
    H and W multiples of ``stride``. BAGEL uses (980, 224, 14) for the ViT and (1024, 512, 16) for the VAE."""

    def __init__(self, max_size: int, min_size: int, stride: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        for name, value in (("max_size", max_size), ("min_size", min_size), ("stride", stride)):
            if value <= 0:
                raise ValueError(f"ImageTransform: {name} must be > 0, got {value}")
        if max_pixels < stride * stride:
            raise ValueError(f"ImageTransform: max_pixels={max_pixels} is below one stride squared ({stride}^2)")
        self.max_size, self.min_size, self.stride, self.max_pixels = max_size, min_size, stride, max_pixels

    def __repr__(self) -> str:
        return f"ImageTransform(max_size={self.max_size}, min_size={self.min_size}, stride={self.stride})"

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the resize rule."""
        return resized_size(width, height, self.max_size, self.min_size, self.stride, self.max_pixels)

    def resize(self, image: Image.Image) -> Image.Image:
        """The resized PIL image (bicubic); returned as is when already the right size."""
        size = self.size_for(*image.size)
        return image if size == image.size else image.resize(size, Image.BICUBIC)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return to_unit_range(self.resize(image))
