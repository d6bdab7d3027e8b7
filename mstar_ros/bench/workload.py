"""Benchmark workloads (texts of different lengths, Poisson arrivals) and latency statistics."""

from __future__ import annotations

import random
from dataclasses import dataclass

WORDS = [
    "robot",
    "arm",
    "camera",
    "voice",
    "stream",
    "token",
    "frame",
    "window",
    "signal",
    "planner",
    "gripper",
    "wheel",
    "sensor",
    "battery",
    "kitchen",
    "table",
    "orange",
    "cable",
    "river",
    "morning",
    "light",
    "sound",
    "music",
    "garden",
    "window",
    "station",
]


@dataclass(frozen=True)
class TTSJob:
    index: int
    text: str
    arrival: float  # seconds after the run starts
    max_tokens: int  # audio length: random weights never say "stop", so length is set per request


def tts_workload(n: int, rate: float, seed: int, min_words: int = 2, max_words: int = 10) -> list[TTSJob]:
    """``n`` texts of ``min_words..max_words`` words; Poisson arrivals at ``rate`` per second;
    audio length grows with the text (4 + 3 frames per word, 7 tokens per frame)."""
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        words = rng.randint(min_words, max_words)
        text = " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."
        jobs.append(TTSJob(i, text, t, 7 * (4 + 3 * words)))
        t += rng.expovariate(rate)
    return jobs


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class JobResult:
    arrival: float
    started: float  # when the server took the request
    first_audio: float
    finished: float
    audio_seconds: float
    tokens: int = 0  # audio tokens generated (7 per 85 ms frame)


def summarize(results: list[JobResult]) -> dict[str, float]:
    ttfa = [r.first_audio - r.arrival for r in results]
    makespan = max(r.finished for r in results) - min(r.arrival for r in results)
    audio = sum(r.audio_seconds for r in results)
    rtf = [(r.finished - r.started) / r.audio_seconds for r in results if r.audio_seconds > 0]
    return {
        "requests": len(results),
        "audio_seconds": round(audio, 3),
        "makespan_s": round(makespan, 3),
        "throughput_audio_s_per_s": round(audio / makespan, 4),
        "audio_tokens_per_s": round(sum(r.tokens for r in results) / makespan, 1),
        "ttfa_p50_ms": round(percentile(ttfa, 50) * 1000, 1),
        "ttfa_p95_ms": round(percentile(ttfa, 95) * 1000, 1),
        "rtf_mean": round(sum(rtf) / len(rtf), 4) if rtf else float("nan"),
    }
