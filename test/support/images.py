"""Images for the tests, made by code: a camera-like picture, a decompression bomb (a PNG that declares a
huge size in a few bytes) and a PNG whose chunks are broken."""

from __future__ import annotations

import struct
import zlib


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit grayscale PNG of width x height whose zlib stream is tiny: only its header says how big."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\0" * ((width + 7) // 8 + 1) * height, 9)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )


def undecodable_png(width: int, height: int) -> bytes:
    """A PNG whose header says width x height and whose image data is not zlib: opening it works, decoding fails."""
    good = bomb_png(width, height)
    at = good.index(b"IDAT") - 4
    data = b"not zlib data"
    return (
        good[:at]
        + struct.pack(">I", len(data))
        + b"IDAT"
        + data
        + struct.pack(">I", zlib.crc32(b"IDAT" + data))
        + good[-12:]
    )


def broken_png() -> bytes:
    """A PNG whose image data chunk says it is half its real length: PIL opens it, then its decoder
    meets garbage where the next chunk should start (SyntaxError "broken PNG file")."""
    import io

    import numpy as np
    import PIL.Image

    buf = io.BytesIO()
    PIL.Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(buf, format="PNG")
    raw = bytearray(buf.getvalue())
    at = raw.index(b"IDAT")
    raw[at - 4 : at] = (int.from_bytes(raw[at - 4 : at], "big") // 2).to_bytes(4, "big")
    return bytes(raw)


def picture(width: int, height: int, seed: int):
    """A smooth colour field with some texture (a PIL image): what a camera frame looks like to the resize, not noise."""
    import numpy as np
    import PIL.Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([128 + 100 * np.sin(x / (7 + seed)), 128 + 100 * np.cos(y / 5), (x + y) % 256], axis=-1)
    return PIL.Image.fromarray((rgb + rng.normal(0, 8, rgb.shape)).clip(0, 255).astype(np.uint8))
