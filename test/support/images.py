"""Images for the tests, made by code: a decompression bomb (a PNG that declares a huge size in a few bytes)
and a PNG whose chunks are broken."""
from __future__ import annotations

import struct
import zlib


def bomb_png(width: int, height: int) -> bytes:
    """A valid 1-bit grayscale PNG of width x height whose zlib stream is tiny: only its header says how big."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = zlib.compress(b"\0" * ((width + 7) // 8 + 1) * height, 9)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


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
    raw[at - 4:at] = (int.from_bytes(raw[at - 4:at], "big") // 2).to_bytes(4, "big")
    return bytes(raw)
