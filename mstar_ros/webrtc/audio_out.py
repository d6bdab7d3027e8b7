"""A peer's outbound audio: the model's chunks, resampled to 48 kHz, sent as 20 ms frames on a clock.

Chunks arrive as the graph decodes them (Orpheus: 24 kHz float PCM). ``push`` resamples each
with one ``av.AudioResampler`` per utterance (its filter state carries across chunks, so chunk
seams are clean) into a queue of 48 kHz s16 samples. ``recv`` (aiortc's encoder pulls it) hands
out exactly one 20 ms frame per 20 ms of wall clock: queued audio while there is some, silence
otherwise, so the stream neither bursts nor stalls. The track hands aiortc Opus packets, not frames:
frames with audio (and the two after, which flush the encoder's look-ahead) go through the peer's own
mono libopus encoder, and every other silent frame is one packet of digital silence encoded once for
the process. An idle peer then costs no encoding at all: aiortc would encode each of its 50 silent
frames a second in a worker thread and measure each one's audio level (about 0.3 ms a frame in all),
CPU the model's threads need on a small machine. (So the packets carry no RTP audio-level header
extension, an optional one; receivers measure levels from the decoded audio.) The one
exception is an utterance's first audio: it goes out as soon as it is queued, not at the next
20 ms slot, and the clock restarts from it (a receiver's jitter buffer takes one early packet in
its stride; waiting for the slot would add 10 ms on average to the time to first audio). ``clear``
drops what is queued (barge-in): the next frame is silence. Frames that had audio and frames
sent silent in the middle of an utterance, after its first audio (an underrun: the model fell
behind), are counted.
"""

from __future__ import annotations

import asyncio
import fractions
import time

import av
import numpy as np
import torch
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000  # 960
TIME_BASE = fractions.Fraction(1, RATE)
OPUS_BIT_RATE = 64_000  # mono speech; aiortc's own encoder spends 96 kb/s on stereo
FLUSH_FRAMES = 2  # silent frames through the encoder after audio: its look-ahead (6.5 ms) comes out


def _opus_encoder() -> av.CodecContext:
    codec = av.CodecContext.create("libopus", "w")
    codec.bit_rate = OPUS_BIT_RATE
    codec.format = "s16"
    codec.layout = "mono"  # RFC 7587: a stereo-negotiated receiver decodes mono packets
    codec.options = {"application": "voip"}
    codec.sample_rate = RATE
    codec.time_base = TIME_BASE
    return codec


def _s16_frame(samples: np.ndarray) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
    frame.sample_rate = RATE
    return frame


def _encode(codec: av.CodecContext, samples: np.ndarray) -> bytes | None:
    packets = codec.encode(_s16_frame(samples))
    return bytes(packets[-1]) if packets else None


_SILENT_PACKET: bytes | None = None


def silent_packet() -> bytes:
    """One Opus packet of a 20 ms digital-silence frame (decodes to zeros), encoded once per process."""
    global _SILENT_PACKET
    if _SILENT_PACKET is None:
        codec = _opus_encoder()
        for _ in range(3):  # past the encoder's start-up frames
            _SILENT_PACKET = _encode(codec, np.zeros(FRAME_SAMPLES, dtype=np.int16)) or _SILENT_PACKET
    assert _SILENT_PACKET is not None
    return _SILENT_PACKET


def pcm_s16(chunk: torch.Tensor) -> np.ndarray:
    """float PCM in [-1, 1] (any shape) -> int16 mono samples."""
    x = chunk.detach().float().reshape(-1).clamp(-1.0, 1.0).numpy()
    return (x * 32767.0).round().astype(np.int16)


class PacedAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = np.zeros(0, dtype=np.int16)
        self._resampler: av.AudioResampler | None = None
        self._source_rate = 0
        self._start: float | None = None
        self._sent = 0
        self._slot0 = 0  # the frame count at which the clock last restarted
        self._audio_ready = asyncio.Event()
        self._encoder: av.CodecContext | None = None
        self._flush_left = 0
        self.speaking = False  # an utterance is under way (pushed audio, not ended)
        self.frames_with_audio = 0
        self.underruns = 0  # silent frames sent while an utterance was under way
        self.first_audio_at: float | None = None  # time.monotonic() the first audible frame went out

    # -- the model's side ---------------------------------------------------------------------------------
    def begin(self) -> None:
        """A new utterance: fresh resampler state, timing of its first audio."""
        self._resampler = None
        self.first_audio_at = None
        self.speaking = True

    def push(self, chunk: torch.Tensor, rate: int) -> None:
        samples = pcm_s16(chunk)
        if rate != RATE:
            if self._resampler is None or self._source_rate != rate:
                self._resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
                self._source_rate = rate
            frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
            frame.sample_rate = rate
            samples = np.concatenate(
                [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)] or [np.zeros(0, dtype=np.int16)]
            )
        self._queue = np.concatenate([self._queue, samples])
        if len(self._queue):
            self._audio_ready.set()

    def end(self) -> None:
        """The utterance is complete: flush the resampler's tail; silence after the queue is not an underrun."""
        if self._resampler is not None:
            tail = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(None)]
            if tail:
                self._queue = np.concatenate([self._queue, *tail])
        self._resampler = None
        self.speaking = False

    def clear(self) -> int:
        """Barge-in: drops the queued audio; returns how many ms were dropped."""
        dropped = len(self._queue) * 1000 // RATE
        self._queue = np.zeros(0, dtype=np.int16)
        self._resampler = None
        self.speaking = False
        return dropped

    @property
    def queued_ms(self) -> int:
        return len(self._queue) * 1000 // RATE

    # -- aiortc's side ------------------------------------------------------------------------------------
    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:  # one frame per 20 ms of wall clock, whatever the queue holds
            wait = self._start + (self._sent - self._slot0) * FRAME_MS / 1000 - time.monotonic()
            if wait > 0:
                first_audio = self.speaking and self.first_audio_at is None
                if first_audio and not len(self._queue):
                    self._audio_ready.clear()
                    try:  # an utterance's first audio goes now, not at the next slot
                        await asyncio.wait_for(self._audio_ready.wait(), wait)
                        self._start, self._slot0 = time.monotonic(), self._sent
                    except asyncio.TimeoutError:
                        pass
                else:
                    await asyncio.sleep(wait)
        out = self._queue[:FRAME_SAMPLES]
        self._queue = self._queue[FRAME_SAMPLES:]
        if len(out):
            self.frames_with_audio += 1
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
        elif self.speaking and self.first_audio_at is not None:
            self.underruns += 1
        packet = av.Packet(self._opus(out))
        packet.pts = self._sent * FRAME_SAMPLES
        packet.time_base = TIME_BASE
        self._sent += 1
        return packet

    def _opus(self, samples: np.ndarray) -> bytes:
        """This frame's Opus packet: the peer's encoder for audio and the frames that flush it, else silence."""
        if len(samples):
            self._flush_left = FLUSH_FRAMES
        elif self._flush_left:
            self._flush_left -= 1
        else:
            return silent_packet()
        if len(samples) < FRAME_SAMPLES:
            samples = np.concatenate([samples, np.zeros(FRAME_SAMPLES - len(samples), dtype=np.int16)])
        if self._encoder is None:
            self._encoder = _opus_encoder()
        return _encode(self._encoder, samples) or silent_packet()
