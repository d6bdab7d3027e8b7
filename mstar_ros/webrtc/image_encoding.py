"""Generated images as files in OpenAI's ``output_format`` (png, jpeg, webp), and base64 for ``b64_json``."""

from __future__ import annotations

import base64
import io

import numpy as np

OUTPUT_FORMATS = ("png", "jpeg", "webp")
PIL_FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
DEFAULT_COMPRESSION = 100  # OpenAI's default output_compression


def encode_image(image: np.ndarray, output_format: str = "png", compression: int = DEFAULT_COMPRESSION) -> bytes:
    """An HWC uint8 RGB image -> the bytes of a file in ``output_format``; ``compression`` (0-100) is
    the quality of a jpeg or webp (100: the best; png is lossless and ignores it)."""
    import PIL.Image

    if output_format not in PIL_FORMATS:
        raise ValueError(f"output_format {output_format!r}: one of {', '.join(OUTPUT_FORMATS)}")
    if not 0 <= compression <= 100:
        raise ValueError(f"output_compression {compression}: 0 to 100")
    buffer = io.BytesIO()
    picture = PIL.Image.fromarray(np.ascontiguousarray(image))  # HWC uint8 x 3: RGB
    options = {} if output_format == "png" else {"quality": int(compression)}
    picture.save(buffer, format=PIL_FORMATS[output_format], **options)
    return buffer.getvalue()


def b64_image(image: np.ndarray, output_format: str = "png", compression: int = DEFAULT_COMPRESSION) -> str:
    """``encode_image`` in base64, as ``b64_json`` carries it."""
    return base64.b64encode(encode_image(image, output_format, compression)).decode()
