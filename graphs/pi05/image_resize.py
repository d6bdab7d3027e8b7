"""Frames that are not the model's size, resized as openpi's training pipeline resizes them.

openpi's data pipeline (``ResizeImages(224, 224)`` in the pi0.5 model transforms, which
calls ``openpi_client.image_tools.resize_with_pad``) works on uint8 RGB: keep the aspect
ratio (``ratio = max(w / size, h / size)``, new sides ``int(side / ratio)``), resize with
PIL's bilinear filter (which widens its kernel when shrinking, so it is antialiased),
paste centred on a black (0) canvas (``int((size - side) / 2)`` before, the odd pixel
after). Float frames in [0, 1] become uint8 first by truncation (``(255 * x).astype(uint8)``,
as openpi's ``convert_to_uint8``). LeRobot instead resizes float frames with
``F.interpolate(bilinear, antialias=False)``; the README gives the measured difference.
"""

from __future__ import annotations

import numpy as np
import torch


def resize_with_pad(image: np.ndarray, size: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [size, size, 3] (returned as is when already that size)."""
    from PIL import Image

    h, w = image.shape[:2]
    if (h, w) == (size, size):
        return image
    ratio = max(w / size, h / size)
    nh, nw = int(h / ratio), int(w / ratio)
    resized = Image.fromarray(np.ascontiguousarray(image)).resize((nw, nh), resample=Image.BILINEAR)
    canvas = Image.new("RGB", (size, size), 0)
    canvas.paste(resized, (max(0, int((size - nw) / 2)), max(0, int((size - nh) / 2))))
    return np.asarray(canvas)


def to_model_size(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 or float ([0, 1]) [C, H, W, 3] -> the same dtype at [C, size, size, 3] (float frames
    that need resizing come back as uint8 / 255, as openpi's pipeline sees them)."""
    if images.shape[1:3] == (size, size):
        return images
    if images.dtype == torch.uint8:
        return torch.from_numpy(np.stack([resize_with_pad(img, size) for img in images.numpy()]))
    as_uint8 = (255 * images.float()).to(torch.uint8)  # truncates, as openpi's convert_to_uint8
    return to_model_size(as_uint8, size).float() / 255.0
