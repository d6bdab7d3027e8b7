"""The peer's outbound track (PacedAudioTrack): 24 kHz chunks come out as 20 ms Opus packets a real
libopus decoder turns back into the audio; idle frames are the shared packet of digital silence."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import torch

from mstar_ros.webrtc.audio_out import FLUSH_FRAMES, FRAME_SAMPLES, RATE, PacedAudioTrack, silent_packet


def decoder() -> av.CodecContext:
    codec = av.CodecContext.create("libopus", "r")  # as a browser negotiates it: opus/48000/2
    codec.format = "s16"
    codec.layout = "stereo"
    codec.sample_rate = RATE
    return codec


def decode(codec: av.CodecContext, packet: av.Packet) -> np.ndarray:
    frames = codec.decode(av.Packet(bytes(packet)))
    return np.concatenate([f.to_ndarray().reshape(-1, 2)[:, 0] for f in frames]).astype(np.float32) / 32767


async def _packets(track: PacedAudioTrack, n: int) -> list[av.Packet]:
    return [await track.recv() for _ in range(n)]


def test_a_tone_comes_back_through_opus_and_idle_frames_are_the_silent_packet():
    track = PacedAudioTrack()
    tone_hz, seconds = 440.0, 0.5
    t = torch.arange(int(24_000 * seconds)) / 24_000
    track.begin()
    for piece in torch.split(0.5 * torch.sin(2 * torch.pi * tone_hz * t), 2_400):  # ten 100 ms chunks at 24 kHz
        track.push(piece, 24_000)
    track.end()
    packets = asyncio.run(_packets(track, 40))  # 0.8 s: the tone (25 frames), then silence

    assert [p.pts for p in packets] == [i * FRAME_SAMPLES for i in range(40)]
    assert all(p.time_base == packets[0].time_base and p.time_base.denominator == RATE for p in packets)
    audio_frames = track.frames_with_audio
    assert audio_frames == 25 and track.underruns == 0
    # the tone's frames and the FLUSH_FRAMES after them went through the peer's encoder; then the silent packet
    silent = silent_packet()
    assert all(bytes(p) != silent for p in packets[:audio_frames])
    assert all(bytes(p) == silent for p in packets[audio_frames + FLUSH_FRAMES :])

    codec = decoder()
    decoded = [decode(codec, p) for p in packets]
    assert all(len(d) == FRAME_SAMPLES for d in decoded)
    heard = np.concatenate(decoded[2 : audio_frames - 1])  # past the encoder's fade-in
    spectrum = np.abs(np.fft.rfft(heard * np.hanning(len(heard))))
    peak_hz = np.argmax(spectrum) * RATE / len(heard)
    assert abs(peak_hz - tone_hz) < 5, peak_hz
    rms = float(np.sqrt(np.mean(heard**2)))
    assert abs(rms - 0.5 / np.sqrt(2)) < 0.05, rms  # Opus at 64 kb/s keeps a tone's level
    # digital silence decodes to exact zeros once the encoder's tail is out: the peers' "loud" test relies on it
    assert all(not np.any(d) for d in decoded[audio_frames + FLUSH_FRAMES :])


def test_an_idle_track_sends_only_the_silent_packet_and_clear_drops_the_queue():
    track = PacedAudioTrack()
    idle = asyncio.run(_packets(track, 3))
    assert {bytes(p) for p in idle} == {silent_packet()} and track.frames_with_audio == 0
    track.begin()
    track.push(torch.full((24_000,), 0.25), 24_000)  # 1 s queued
    assert track.queued_ms >= 990
    dropped = track.clear()
    assert dropped >= 990 and track.queued_ms == 0
    after = asyncio.run(_packets(track, 2))
    assert {bytes(p) for p in after} == {silent_packet()} and track.frames_with_audio == 0
