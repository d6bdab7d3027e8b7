"""A request's audio and image parts, judged by their headers before any decoding work.

Audio (``input_audio``: base64 ``wav`` or ``pcm16`` at 24 kHz, as OpenAI takes it): its duration is
read from the header (frames / rate) and checked against what the request has left of its seconds
before a sample is decoded or resampled; a sample rate outside [1 kHz, 384 kHz] is refused.
Images (``image_url`` / ``input_image`` with a base64 ``data:`` URL; this server fetches nothing):
``open_image`` reads the header only -- format, width and height -- and checks the sizes; the
caller checks the model's room for them and reserves their pixels in the gateway's shared decoding
budget, and only then ``load_image`` decodes them.
"""

from __future__ import annotations

import base64
import binascii
import io
import wave
from typing import Any

import numpy as np
import torch

PCM16_INPUT_RATE = 24_000  # OpenAI's pcm16 input audio
MIN_INPUT_RATE, MAX_INPUT_RATE = 1_000, 384_000
MAX_AUDIO_S = 300.0  # of all a request's audio together (the Thinker hears it all, every request)
MAX_IMAGE_PIXELS = 8192 * 8192  # one image's declared size: as many pixels as the released model's context holds
MAX_REQUEST_IMAGE_PIXELS = 2 * MAX_IMAGE_PIXELS  # all of a request's images together
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


class BadRequest(ValueError):
    pass


def _base64(data: Any, what: str) -> bytes:
    if not isinstance(data, str):
        raise BadRequest(f"{what} must be a base64 string")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is not valid base64") from None


def decode_audio(part: dict[str, Any], rate: int, seconds_left: list[float] | None = None) -> torch.Tensor:
    """An ``input_audio`` part -> mono float samples at ``rate``. ``seconds_left`` ([seconds]): what the
    request's audio may still last, checked from the header and then spent."""
    audio = part.get("input_audio") if isinstance(part.get("input_audio"), dict) else {}
    fmt = audio.get("format", "wav")
    raw = _base64(audio.get("data", ""), "input_audio.data")
    left = MAX_AUDIO_S if seconds_left is None else seconds_left[0]
    if fmt == "wav":
        source_rate, channels, pcm = _wav_samples(raw, left)
        pcm = pcm.reshape(-1, channels).mean(axis=1) if channels > 1 else pcm
    elif fmt == "pcm16":
        seconds = len(raw) // 2 / PCM16_INPUT_RATE
        _check_seconds(seconds, left)
        source_rate, pcm = PCM16_INPUT_RATE, np.frombuffer(raw[: len(raw) // 2 * 2], dtype=np.int16)
    else:
        raise BadRequest(f"input_audio.format {fmt!r}: wav or pcm16")
    if seconds_left is not None:
        seconds_left[0] -= len(pcm) / source_rate
    samples = torch.from_numpy(pcm.astype(np.float32) / 32768.0)
    if source_rate != rate and samples.numel():
        import av

        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = source_rate
        resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
        out = [f.to_ndarray().reshape(-1) for f in [*resampler.resample(frame), *resampler.resample(None)]]
        samples = torch.from_numpy(np.concatenate(out).astype(np.float32) / 32768.0)
    return samples


def _wav_samples(raw: bytes, seconds_left: float) -> tuple[int, int, np.ndarray]:
    """(rate, channels, interleaved int16 samples) of a WAV, its duration checked from the header first."""
    try:
        with wave.open(io.BytesIO(raw)) as w:
            rate, channels, width, frames = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            if width != 2:
                raise BadRequest(f"input_audio wav must be 16-bit PCM, not {8 * width}-bit")
            if not MIN_INPUT_RATE <= rate <= MAX_INPUT_RATE:
                raise BadRequest(
                    f"input_audio wav sample rate {rate} Hz: must be in [{MIN_INPUT_RATE}, {MAX_INPUT_RATE}]"
                )
            if not 1 <= channels <= 8:
                raise BadRequest(f"input_audio wav has {channels} channels: 1 to 8")
            _check_seconds(frames / rate, seconds_left)  # the header's claim, before any sample is read
            pcm = np.frombuffer(w.readframes(frames), dtype=np.int16)
    except (wave.Error, EOFError) as exc:
        raise BadRequest(f"input_audio is not a readable wav: {exc}") from None
    return rate, channels, pcm[: len(pcm) // channels * channels]


def _check_seconds(seconds: float, left: float) -> None:
    if seconds > left:
        raise BadRequest(
            f"the messages' audio is over the {MAX_AUDIO_S:g} s limit (this clip alone is {seconds:.0f} s)"
        )


def image_url(part: dict[str, Any]) -> Any:
    """The data URL of an ``image_url`` (chat completions) or ``input_image`` (Realtime) part."""
    url = part.get("image_url")
    return url.get("url", "") if isinstance(url, dict) else url


def open_image(
    url: Any,
    pixels_left: list[int] | None = None,
    what: str = "the request's images",
    limit: int = MAX_REQUEST_IMAGE_PIXELS,
):
    """A base64 ``data:`` URL -> a PIL image with its header read and its pixels not yet decoded.
    ``pixels_left`` ([pixels]): what the request's images may still hold together (named ``what``, out of
    ``limit``), checked against this one's declared size and then spent."""
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadRequest("image_url.url must be a data: URL (data:image/png;base64,...): this server fetches nothing")
    head, _, data = url.partition(",")
    if not head.endswith(";base64"):
        raise BadRequest("an image data: URL must be base64 (data:image/png;base64,...)")
    return open_image_bytes(_base64(data, "the image data: URL"), pixels_left, what, limit)


def open_image_bytes(
    raw: bytes,
    pixels_left: list[int] | None = None,
    what: str = "the request's images",
    limit: int = MAX_REQUEST_IMAGE_PIXELS,
):
    """An image file's bytes -> a PIL image with its header read and its pixels not yet decoded, judged
    as ``open_image`` judges a data URL's."""
    import PIL.Image

    try:
        image = PIL.Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)  # reads the header only
    except PIL.Image.DecompressionBombError as exc:
        raise BadRequest(f"the image is too large: {exc}") from None
    except Exception:  # PIL raises OSError, SyntaxError, ValueError ... for a file it cannot parse
        raise BadRequest(f"the image is not a readable {', '.join(IMAGE_FORMATS)} file") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise BadRequest(
            f"the image is {width} x {height} = {width * height} pixels, over the limit of {MAX_IMAGE_PIXELS}"
        )
    if pixels_left is not None:
        if width * height > pixels_left[0]:
            raise BadRequest(f"{what} are over {limit} pixels together")
        pixels_left[0] -= width * height
    return image


def load_image(image) -> None:
    """Decode an opened image's pixels (reserve them first: they cost memory and CPU)."""
    try:
        image.load()
    except Exception as exc:  # a corrupt chunk: SyntaxError("broken PNG file"), OSError (truncated) ...
        raise BadRequest(f"the image could not be decoded: {exc}") from None


def release_images(images) -> None:
    """Free decoded images' pixels now (PIL's ``close``), whoever still refers to them."""
    for image in images:
        image.close()


def pixels(images) -> int:
    return sum(image.width * image.height for image in images)
