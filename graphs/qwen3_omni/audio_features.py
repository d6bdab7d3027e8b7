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


def mel_filters(
    bins: int = N_FFT // 2 + 1, mels: int = 128, rate: int = SAMPLE_RATE, low: float = 0.0, high: float = 8000.0
) -> torch.Tensor:
    """[bins, mels] float32 triangular filters, Slaney-normalised."""
    edges = mel_to_hertz(np.linspace(hertz_to_mel(low), hertz_to_mel(high), mels + 2))
    fft = np.linspace(0, rate // 2, bins)
    slopes = edges[None, :] - fft[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    tri = np.maximum(0.0, np.minimum(down, up))
    enorm = 2.0 / (edges[2 : mels + 2] - edges[:mels])
    return torch.from_numpy(tri * enorm[None, :]).to(torch.float32)


_FILTERS: dict[int, torch.Tensor] = {}


def check_samples(samples: torch.Tensor) -> None:
    if samples.numel() > MAX_SECONDS * SAMPLE_RATE:
        raise ValueError(f"audio of {samples.numel() / SAMPLE_RATE:.1f} s is over the {MAX_SECONDS:g} s limit")
    if not torch.isfinite(samples).all():
        raise ValueError("audio contains NaN or infinite samples")


def log10_mel(frames_power: torch.Tensor, mels: int = 128) -> torch.Tensor:
    """Power spectra [201, T] -> log10 mel energies [mels, T], clamped at 1e-10 (not yet floored)."""
    if mels not in _FILTERS:
        _FILTERS[mels] = mel_filters(mels=mels)
    return torch.clamp(_FILTERS[mels].T @ frames_power, min=1e-10).log10()


def floor_and_scale(spec: torch.Tensor) -> torch.Tensor:
    """log10 mel energies of one whole clip -> the encoder's features: floored 8 below the clip's max, scaled."""
    return (torch.maximum(spec, spec.max() - 8.0) + 4.0) / 4.0


def log_mel(samples: torch.Tensor, mels: int = 128) -> torch.Tensor:
    """16 kHz mono float samples [N] -> features [mels, N // 160]."""
    if samples.dim() != 1 or samples.numel() < N_FFT:
        raise ValueError(
            f"audio must be mono samples, at least {N_FFT} of them (25 ms at 16 kHz); got shape {tuple(samples.shape)}"
        )
    check_samples(samples)
    stft = torch.stft(samples.float(), N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    power = (stft[..., :-1].abs() ** 2).contiguous()
    return floor_and_scale(log10_mel(power, mels))


def streamed_log10_mel(samples: torch.Tensor, context: int, first: bool, final: bool, mels: int = 128) -> torch.Tensor:
    """The frames one chunk of a streamed clip completes, as :func:`log_mel` computes them on the whole clip
    (before the floor, which needs the whole clip's maximum).

    ``samples``: the chunk, its first ``context`` samples already delivered before (context only); every
    chunk starts at a multiple of the hop. A frame is centred on a multiple of the hop and needs
    ``N_FFT // 2`` samples each side: a chunk completes the frames whose right half it holds, from where
    the previous chunk stopped; the first chunk reflects the clip's start, the ``final`` one its end (as
    ``torch.stft(center=True)`` does) and stops where :func:`log_mel` drops the last frame.
    """
    half = N_FFT // 2
    n = samples.numel()
    first_centre = 0 if first else ((context - half) // HOP + 1) * HOP
    last_centre = (n // HOP - 1) * HOP if final else ((n - half) // HOP) * HOP
    if last_centre < first_centre:
        return torch.zeros(mels, 0)
    if not first and first_centre < half:
        raise ValueError(f"a chunk needs {half + HOP} samples of context, got {context}")
    x = samples.float()
    if first:
        if n <= half:
            raise ValueError(f"a clip needs more than {half} samples ({half * 1000 // SAMPLE_RATE} ms)")
        x = torch.cat([x[1 : half + 1].flip(0), x])
    if final:
        if n <= half:
            raise ValueError(f"a clip's end needs more than {half} samples of context")
        x = torch.cat([x, x[-half - 1 : -1].flip(0)])
    offset = half if first else 0
    segment = x[first_centre + offset - half : last_centre + offset + half]
    stft = torch.stft(segment, N_FFT, HOP, window=torch.hann_window(N_FFT), center=False, return_complex=True)
    return log10_mel((stft.abs() ** 2).contiguous(), mels)
