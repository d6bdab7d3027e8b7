"""A request's audio and images judged from their headers before any decoding."""

from __future__ import annotations

import base64
import io
import struct

import numpy as np
import pytest

from mstar_ros.webrtc.media_parts import BadRequest, decode_audio, load_image, open_image, pixels
from support.images import bomb_png


def wav(rate: int, frames: int, claimed_frames: int | None = None, channels: int = 1) -> dict:
    """An input_audio part: a 16-bit WAV whose header says ``rate`` and ``claimed_frames`` (default: the truth)."""
    data = np.arange(frames * channels, dtype=np.int16).tobytes()
    claimed = len(data) if claimed_frames is None else claimed_frames * 2 * channels
    raw = (
        b"RIFF"
        + struct.pack("<I", 36 + claimed)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
        + b"data"
        + struct.pack("<I", claimed)
        + data
    )
    return {"type": "input_audio", "input_audio": {"format": "wav", "data": base64.b64encode(raw).decode()}}


@pytest.mark.parametrize(
    "part, error",
    [
        (wav(0, 100), r"sample rate 0 Hz: must be in \[1000, 384000\]"),
        (wav(100, 1000), r"sample rate 100 Hz"),
        (wav(16_000, 10, claimed_frames=16_000 * 400), r"over the 300 s limit \(this clip alone is 400 s\)"),
        (wav(8_000, 8_000 * 301), r"this clip alone is 301 s"),
        (wav(16_000, 10, channels=9), "9 channels"),
        (
            {"input_audio": {"format": "pcm16", "data": base64.b64encode(bytes(2 * 24_000 * 301)).decode()}},
            "this clip alone is 301 s",
        ),
        ({"input_audio": {"format": "mp3", "data": ""}}, "wav or pcm16"),
        ({"input_audio": {"format": "wav", "data": 5}}, "must be a base64 string"),
    ],
)
def test_audio_is_refused_from_its_header_with_a_clear_reason(part, error):
    with pytest.raises(BadRequest, match=error):
        decode_audio(part, 16_000)


def test_audio_spends_the_request_s_seconds_and_is_resampled_to_the_model_s_rate():
    left = [300.0]
    samples = decode_audio(wav(8_000, 8_000 * 2), 16_000, left)
    assert abs(samples.numel() - 32_000) <= 64 and left == [298.0]
    with pytest.raises(BadRequest, match="this clip alone is 299 s"):
        decode_audio(wav(8_000, 8_000 * 299), 16_000, left)  # 299 s fit alone, not after the first 2 s


def test_an_image_is_opened_without_its_pixels_and_decoded_only_by_load_image():
    import PIL.Image

    buf = io.BytesIO()
    PIL.Image.new("RGB", (640, 480), (10, 200, 30)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    left = [10**6]
    image = open_image(url, left)
    assert image.size == (640, 480) and image.tile  # header read, pixels not decoded (the tile is pending)
    assert left == [10**6 - 640 * 480] and pixels([image, image]) == 2 * 640 * 480
    load_image(image)
    assert not image.tile and image.getpixel((5, 5)) == (10, 200, 30)
    huge = open_image("data:image/png;base64," + base64.b64encode(bomb_png(8192, 8192)).decode())
    assert huge.size == (8192, 8192) and huge.tile  # 67 M pixels declared in a few KB: nothing decoded yet
    with pytest.raises(BadRequest, match="the request's images are over 1000 pixels together"):
        open_image(url, [1000], limit=1000)
