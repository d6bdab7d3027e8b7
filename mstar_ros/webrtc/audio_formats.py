"""Audio in the formats OpenAI's audio routes answer with, encoded as the samples arrive.

16-bit mono at the model's rate goes in, chunk by chunk; each ``encode`` returns the bytes that are
ready, so a response streams them while the model is still speaking. Every format streams:
- ``pcm``: the raw samples (signed 16-bit little-endian);
- ``wav``: a header whose sizes say "unknown" (0xFFFFFFFF, as streaming servers write), then the samples;
- ``mp3`` (MPEG-2 layer III at 24 kHz), ``aac`` (ADTS frames), ``opus`` (Ogg pages of 20 ms),
  ``flac`` (its STREAMINFO leaves the total length unknown, which the format allows): PyAV's encoders
  and muxers, written into a buffer that is emptied after each chunk. Nothing is seekable, so no muxer
  goes back to patch a header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import av
import numpy as np


@dataclass(frozen=True)
class AudioFormat:
    content_type: str
    container: str | None = None  # PyAV's muxer; None: written here (pcm, wav)
    codec: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # the muxer's


FORMATS: dict[str, AudioFormat] = {
    "mp3": AudioFormat("audio/mpeg", "mp3", "libmp3lame"),
    # an Ogg page at most every 20 ms: the muxer's default (1 s) would hold a second of audio back
    "opus": AudioFormat("audio/ogg", "ogg", "libopus", (("page_duration", "20000"),)),
    "aac": AudioFormat("audio/aac", "adts", "aac"),
    "flac": AudioFormat("audio/flac", "flac", "flac"),
    "wav": AudioFormat("audio/wav"),
    "pcm": AudioFormat("audio/pcm"),
}


def wav_header(rate: int) -> bytes:
    """A mono 16-bit WAV header for a stream of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


class _Sink:
    """Where a muxer writes: the bytes since the last ``take``. Not seekable, on purpose."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class AudioEncoder:
    """One response's audio in ``fmt`` (a key of FORMATS): ``encode`` each chunk of int16 samples,
    then ``finish`` once; each returns the bytes ready to send."""

    def __init__(self, fmt: str, rate: int) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown audio format {fmt!r}: {', '.join(FORMATS)}")
        self.fmt, self.rate, self.spec = fmt, rate, FORMATS[fmt]
        self._started = False
        self._container = None
        if self.spec.container is not None:
            self._sink = _Sink()
            self._container = av.open(self._sink, "w", format=self.spec.container, options=dict(self.spec.options))
            self._stream = self._container.add_stream(self.spec.codec, rate=rate, layout="mono")
            # the codec's own sample format (mp3: s16p, aac: fltp, opus and flac: s16)
            self._convert = av.AudioResampler(format=self._stream.codec_context.format.name, layout="mono", rate=rate)
            self._pts = 0

    @property
    def content_type(self) -> str:
        return self.spec.content_type

    def encode(self, pcm: np.ndarray) -> bytes:
        """``pcm``: int16 samples, mono."""
        pcm = np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1)
        head = b""
        if not self._started:
            self._started = True
            head = wav_header(self.rate) if self.fmt == "wav" else b""
        if self._container is None:
            return head + pcm.tobytes()
        if len(pcm):
            frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.rate, self._pts
            self._pts += len(pcm)
            self._mux(self._convert.resample(frame))
        return head + self._sink.take()

    def finish(self) -> bytes:
        """The encoder's last frames and the container's trailer. A response with no samples gets one
        codec frame of silence: an MP3, AAC or Ogg stream without a frame is no file a decoder opens."""
        head = self.encode(np.zeros(0, np.int16)) if not self._started else b""
        if self._container is None:
            return head
        if self._pts == 0:
            head += self.encode(np.zeros(self._stream.codec_context.frame_size or self.rate // 50, np.int16))
        self._mux(self._convert.resample(None))
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self.close()
        return head + self._sink.take()

    def close(self) -> None:
        """Let go of the encoder without finishing (a response cut short)."""
        if self._container is not None:
            self._container.close()
            self._container = None

    def _mux(self, frames) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)


def encode_whole(pcm: np.ndarray, fmt: str, rate: int) -> bytes:
    """A whole clip in ``fmt`` (a WAV then with its real sizes)."""
    if fmt == "wav":
        data = np.ascontiguousarray(pcm, dtype=np.int16).tobytes()
        return (
            b"RIFF"
            + struct.pack("<I", 36 + len(data))
            + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data"
            + struct.pack("<I", len(data))
            + data
        )
    encoder = AudioEncoder(fmt, rate)
    return encoder.encode(pcm) + encoder.finish()
