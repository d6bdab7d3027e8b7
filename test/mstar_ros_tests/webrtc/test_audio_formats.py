"""Each response format, encoded chunk by chunk as a response streams it, decodes back (PyAV) to the
audio that went in: its duration, and for the lossless ones its samples."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from mstar_ros.webrtc.audio_formats import FORMATS, AudioEncoder, encode_whole

RATE = 24_000
# codec frames an encoder may add (priming and padding: mp3 1152-sample frames, AAC 1024, Opus 20 ms)
SLACK = {"mp3": 2 * 1152, "aac": 2 * 1024, "opus": 0, "flac": 0, "wav": 0, "pcm": 0}


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * 220 * t) * 0.4 * 32767).astype(np.int16)


def decoded(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """(mono int16 samples, rate) of a file, as a client's decoder reads it."""
    if fmt == "pcm":
        return np.frombuffer(data, np.int16), RATE
    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].rate
        frames = list(container.decode(audio=0))
    resample = av.AudioResampler(format="s16", layout="mono", rate=rate)
    out = [f.to_ndarray().reshape(-1) for frame in frames for f in resample.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resample.resample(None)]
    return (np.concatenate(out) if out else np.zeros(0, np.int16)), rate


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_streamed_file_decodes_to_the_duration_that_went_in(fmt):
    pcm = tone(1.5)
    encoder = AudioEncoder(fmt, RATE)
    pieces = [encoder.encode(chunk) for chunk in np.array_split(pcm, 9)]  # uneven chunks, as a vocoder's
    pieces.append(encoder.finish())
    # streamed: bytes come out before the end, not only at finish (Ogg holds at most a 20 ms page)
    assert sum(len(p) for p in pieces[:-1]) > 0, [len(p) for p in pieces]
    samples, rate = decoded(b"".join(pieces), fmt)
    got_s, want_s = len(samples) / rate, len(pcm) / RATE
    assert want_s <= got_s + 1e-9 and got_s - want_s <= SLACK[fmt] / RATE + 1e-9, (fmt, got_s, want_s)
    if fmt in ("pcm", "wav", "flac"):  # lossless: the very samples
        assert np.array_equal(samples[: len(pcm)], pcm)


def test_wav_streams_an_open_ended_header_and_a_whole_clip_gets_its_real_sizes():
    pcm = tone(0.5)
    encoder = AudioEncoder("wav", RATE)
    streamed = encoder.encode(pcm) + encoder.finish()
    assert streamed[4:8] == b"\xff\xff\xff\xff" and streamed[44:] == pcm.tobytes()
    whole = encode_whole(pcm, "wav", RATE)
    assert int.from_bytes(whole[40:44], "little") == len(pcm) * 2
    assert np.array_equal(decoded(whole, "wav")[0], pcm)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav"])
def test_a_response_without_samples_is_still_a_file_a_decoder_opens(fmt):
    encoder = AudioEncoder(fmt, RATE)
    samples, _ = decoded(encoder.finish(), fmt)
    assert len(samples) <= SLACK[fmt] + 1152 and not samples.any()  # at most a codec frame, of silence


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown audio format 'ogg'"):
        AudioEncoder("ogg", RATE)
