"""The audio encoder's input: 128-bin log-mel frames of 16 kHz audio, 10 ms apart, as Whisper computes them.

Qwen3-Omni's processor uses transformers' ``WhisperFeatureExtractor`` (n_fft 400, hop 160, Hann
window, Slaney mel scale and area normalisation from 0 to 8 kHz, no dither): power spectrogram
(the last STFT frame dropped, so a clip of N samples gives N // 160 frames), log10 clamped at
1e-10, floored 8 below the clip's maximum, then ``(x + 4) / 4``. The filter bank is computed here
from the Slaney formulas in float64 and cast to float32 for the product, as transformers does.
"""
from __future__ import annotations

import numpy as np
import torch

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
MAX_SECONDS = 300.0  # the processor's chunk_length: longer audio is refused, not cut


def hertz_to_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    mel = 3.0 * f / 200.0
    log = f >= 1000.0
    return np.where(log, 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) * 27.0 / np.log(6.4), mel)


def mel_to_hertz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f = 200.0 * m / 3.0
    return np.where(m >= 15.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (m - 15.0)), f)


def mel_filters(bins: int = N_FFT // 2 + 1, mels: int = 128, rate: int = SAMPLE_RATE,
                low: float = 0.0, high: float = 8000.0) -> torch.Tensor:
    """[bins, mels] float32 triangular filters, Slaney-normalised."""
    edges = mel_to_hertz(np.linspace(hertz_to_mel(low), hertz_to_mel(high), mels + 2))
    fft = np.linspace(0, rate // 2, bins)
    slopes = edges[None, :] - fft[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    tri = np.maximum(0.0, np.minimum(down, up))
    enorm = 2.0 / (edges[2:mels + 2] - edges[:mels])
    return torch.from_numpy(tri * enorm[None, :]).to(torch.float32)


_FILTERS: dict[int, torch.Tensor] = {}


def log_mel(samples: torch.Tensor, mels: int = 128) -> torch.Tensor:
    """16 kHz mono float samples [N] -> features [mels, N // 160]."""
    if samples.dim() != 1 or samples.numel() < N_FFT:
        raise ValueError(f"audio must be mono samples, at least {N_FFT} of them (25 ms at 16 kHz); "
                         f"got shape {tuple(samples.shape)}")
    if samples.numel() > MAX_SECONDS * SAMPLE_RATE:
        raise ValueError(f"audio of {samples.numel() / SAMPLE_RATE:.1f} s is over the {MAX_SECONDS:g} s limit")
    if not torch.isfinite(samples).all():
        raise ValueError("audio contains NaN or infinite samples")
    if mels not in _FILTERS:
        _FILTERS[mels] = mel_filters(mels=mels)
    stft = torch.stft(samples.float(), N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    power = (stft[..., :-1].abs() ** 2).contiguous()
    spec = torch.clamp(_FILTERS[mels].T @ power, min=1e-10).log10()
    spec = torch.maximum(spec, spec.max() - 8.0)
    return (spec + 4.0) / 4.0
