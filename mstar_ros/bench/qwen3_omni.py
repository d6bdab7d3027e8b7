"""``mstar-ros bench qwen3-omni``: our Qwen3-Omni serving vs transformers' ``generate(return_audio=True)``.

Same checkpoint, same run. The workload: C requests at once (C = concurrency), ``rounds`` times;
each a text prompt, the Thinker's reply capped at ``thinker_tokens`` and the Talker's at
``talker_tokens`` frames (random weights never end early, so every request makes the same amount
of audio in both systems). The Talker samples as the reference's ``generate`` does by default.

- ours: the Conductor serves the C requests together (every stage batched); time to first audio is
  the first Code2Wav chunk's arrival; RTF per request is its time from submission to its last audio
  chunk over its audio seconds; throughput is all audio seconds over the wall time.
- the reference serves one request after another (``generate`` takes one at a time): each request's
  time is measured, half of them before ours and half after (the median counts), and a request's
  time to first audio at concurrency C is when its whole waveform is back after the requests
  queued before it (``generate`` returns no audio before the end).

Keys ``ttfa_growth_1_to_8`` (ours, p50 at 8 / p50 at 1) and ``throughput_ratio_c8``. Each level also has
``cpu_cores_busy``: CPU seconds per wall second of this process and, under a placement, of each Worker
rank, which shows a rank that is the bottleneck and one that waits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from mstar.engine.dtype_choice import resolve_dtype
from mstar.progress import progress_bar
from mstar_ros.bench.machine import dtypes_section, header_line, machine_section
from mstar_ros.bench.workload import percentile

log = logging.getLogger("mstar_ros.bench")
PROMPTS = [
    "hello there, how are you today",
    "what is the weather like",
    "the robot can hear you",
    "speak back to you in real time",
    "how are you",
    "what is the robot",
    "you can speak",
    "hello robot",
]
GOALS = {"ttfa_growth_1_to_8": 1.5, "throughput_ratio_c8": 3.0}


@dataclass
class OmniBenchOptions:
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    rounds: int = 2
    thinker_tokens: int = 16
    talker_tokens: int = 64
    baseline_requests: int = 4  # half before ours, half after
    preset: str = "bench"
    weights: str | None = None
    first_chunk: int | None = None
    dtype: str = "auto"  # ours: the fastest this machine runs natively (mstar.engine.dtype_choice)
    baseline_dtype: str = "fastest"  # transformers: the faster of float32 and bfloat16, timed in this run
    placement: str | None = None  # ours in Worker processes (e.g. the two-rank disaggregation)
    talker_after_reply: bool = False  # ours starts the Talker once the reply is complete (the reference's order)


def _stats(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50), 1), "p95": round(percentile(values, 95), 1)}


def _cpu_seconds(conductor) -> dict[str, float]:
    """CPU time so far of this process and of each Worker process (Linux /proc; ranks whose stat cannot be read
    are left out): where a placement's ranks are busy and where they wait."""
    times = os.times()
    out = {"this process": times.user + times.system}
    if conductor.pool is not None:
        tick = os.sysconf("SC_CLK_TCK")
        for status in conductor.worker_status():
            try:
                with open(f"/proc/{status.pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[f"rank {status.rank}"] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
            except (OSError, IndexError, ValueError, TypeError):
                continue
    return out


async def _ours_level(chat, conductor, c: int, opts: OmniBenchOptions, bar) -> dict:
    ttfa, rtf, audio_s = [], [], 0.0
    start = time.perf_counter()
    cpu_before = _cpu_seconds(conductor)
    for r in range(opts.rounds):

        async def one(i: int, r: int = r) -> None:
            nonlocal audio_s
            request = chat.request(PROMPTS[(i + r) % len(PROMPTS)], sampling=_talker(chat, opts, seed=i + 100 * r))
            request.meta["thinker_max_tokens"] = opts.thinker_tokens
            request.meta["talker_after_reply"] = opts.talker_after_reply
            t0 = time.perf_counter()
            first, last, samples = None, None, 0
            async for out in conductor.submit(request):
                if out.name == chat.audio_output:
                    last = time.perf_counter()
                    first = first or last
                    samples += out.data.numel()
            seconds = samples / chat.sample_rate
            ttfa.append((first - t0) * 1000)
            rtf.append((last - t0) / seconds)
            audio_s += seconds

        await asyncio.gather(*(one(i) for i in range(c)))
        bar.update(1)
    wall = time.perf_counter() - start
    cpu_after = _cpu_seconds(conductor)
    busy = {name: round((cpu_after[name] - cpu_before[name]) / wall, 3) for name in cpu_after if name in cpu_before}
    return {
        "requests": c * opts.rounds,
        "ttfa_ms": _stats(ttfa),
        "rtf": _stats(rtf),
        "audio_s": round(audio_s, 2),
        "wall_s": round(wall, 2),
        "throughput_audio_s_per_s": round(audio_s / wall, 3),
        "cpu_cores_busy": busy,
    }


def _talker(chat, opts: OmniBenchOptions, seed: int):
    import msgspec

    return msgspec.structs.replace(chat.default_sampling, max_tokens=opts.talker_tokens, seed=seed)


class Baseline:
    """transformers' generate, one request at a time; timed in two halves, before and after ours
    (the machine's speed drifts: the median of both halves is what ours is compared with)."""

    def __init__(self, path, dtype: str = "float32") -> None:
        from mstar_graphs.qwen3_omni.chat import load_tokenizer
        from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig
        from mstar_graphs.qwen3_omni.reference import load_reference

        self.dtype = dtype
        self.model = load_reference(path, dtype=getattr(torch, dtype))
        self.tokenizer, self.cfg = load_tokenizer(path), Qwen3OmniConfig.from_dir(path)
        self.times: list[float] = []
        self.audio: list[float] = []
        self.count = 0

    def run(self, n: int, opts: OmniBenchOptions, bar, warm: bool = False) -> None:
        from mstar_graphs.qwen3_omni.chat import Turn, prompt_ids
        from mstar_graphs.qwen3_omni.reference import reference_generate

        for _ in range(n + warm):
            i = self.count
            self.count += 1
            ids = prompt_ids(self.tokenizer, self.cfg, [Turn("user", PROMPTS[i % len(PROMPTS)])])
            t0 = time.perf_counter()
            out = reference_generate(
                self.model,
                ids,
                thinker_max_new_tokens=opts.thinker_tokens,
                talker_max_new_tokens=opts.talker_tokens,
                sample=True,
                seed=i,
            )
            if warm and i == 0:
                continue  # the first call warms up, not counted
            self.times.append(time.perf_counter() - t0)
            self.audio.append(out.audio.numel() / 24_000)
            bar.update(1)

    def report(self) -> dict:
        per_request = percentile(self.times, 50)
        audio = sum(self.audio) / len(self.audio)
        return {
            "requests": len(self.times),
            "seconds_per_request": round(per_request, 3),
            "seconds_each": [round(t, 3) for t in self.times],
            "audio_s_per_request": round(audio, 3),
            "throughput_audio_s_per_s": round(audio / per_request, 3),
        }


def _baseline(path, opts: OmniBenchOptions, bar) -> tuple[Baseline, dict[str, float] | None]:
    """transformers in ``opts.baseline_dtype``; ``fastest``: one warm-up and one timed request in each of
    float32 and bfloat16, and the faster kept (a CPU user would try both), with those timings."""
    if opts.baseline_dtype != "fastest":
        name = resolve_dtype(opts.baseline_dtype).dtype  # auto: as our engines would decide here
        return Baseline(path, name), None
    timings, candidates = {}, {}
    for name in ("float32", "bfloat16"):
        candidate = Baseline(path, name)
        candidate.run(1, opts, bar, warm=True)
        timings[name] = round(candidate.times.pop(), 3)
        candidate.audio.pop()
        candidates[name] = candidate
    best = min(timings, key=timings.get)
    return candidates[best], timings


def _queued_ttfa(per_request_s: float, c: int) -> dict[str, float]:
    """One after another: the k-th of C simultaneous requests has its audio after k whole requests."""
    return _stats([per_request_s * (k + 1) * 1000 for k in range(c)])


async def _ours(chat, opts: OmniBenchOptions, bar) -> dict:
    from mstar.engine.config import EngineConfig
    from mstar_ros.webrtc.speech_models import speech_conductor

    levels = {}
    async with speech_conductor(chat, EngineConfig(dtype=opts.dtype), opts.placement) as conductor:
        warm = chat.request("hello", sampling=_talker(chat, opts, seed=0))
        warm.meta["thinker_max_tokens"] = 4
        await conductor.submit(warm).collect()
        for c in opts.concurrency:
            levels[str(c)] = await _ours_level(chat, conductor, c, opts, bar)
        workers = conductor.dtype_summary()  # with a placement, each Worker process decided for itself
    return levels, workers


def run_omni_bench(opts: OmniBenchOptions) -> dict:
    from mstar_graphs.qwen3_omni.frontend import Qwen3OmniChat

    chat = Qwen3OmniChat.load(opts.weights, progress=True, preset=opts.preset, first_chunk=opts.first_chunk)
    calibrating = 2 if opts.baseline_dtype == "fastest" else 0
    bar = progress_bar(
        total=len(opts.concurrency) * opts.rounds + opts.baseline_requests + calibrating,
        desc="bench qwen3-omni",
        unit="round",
    )
    reference, calibration = _baseline(chat.model.path, opts, bar)
    before = (opts.baseline_requests + 1) // 2
    reference.run(before, opts, bar, warm=calibration is None)
    ours_choice = resolve_dtype(opts.dtype)
    ours, ours_workers = asyncio.run(_ours(chat, opts, bar))
    reference.run(opts.baseline_requests - before, opts, bar)
    baseline = reference.report()
    bar.close()
    levels = {}
    for c in opts.concurrency:
        level = {
            "ours": ours[str(c)],
            "baseline_sequential": {
                "ttfa_ms": _queued_ttfa(baseline["seconds_per_request"], c),
                "throughput_audio_s_per_s": baseline["throughput_audio_s_per_s"],
            },
        }
        level["throughput_ratio"] = round(
            level["ours"]["throughput_audio_s_per_s"] / baseline["throughput_audio_s_per_s"], 3
        )
        levels[str(c)] = level
    lo, hi = str(min(opts.concurrency)), str(max(opts.concurrency))
    base_why = (
        f"the faster of float32 and bfloat16 for transformers, one request each timed now: {calibration}"
        if calibration
        else f"--baseline-dtype {opts.baseline_dtype}"
    )
    report = {
        "model": {
            "preset": opts.preset if opts.weights is None else None,
            "weights": str(chat.model.path),
            "random_weights": chat.random_weights,
            "first_chunk_frames": opts.first_chunk or 25,
            "talker_after_reply": opts.talker_after_reply,
            "dtype": ours_choice.dtype,
            "baseline_dtype": reference.dtype,
            "placement": opts.placement,
        },
        "options": {
            "concurrency": opts.concurrency,
            "rounds": opts.rounds,
            "thinker_tokens": opts.thinker_tokens,
            "talker_tokens": opts.talker_tokens,
        },
        "machine": machine_section(),
        "dtypes": {**dtypes_section(ours_choice, reference.dtype, base_why), "ours_workers": ours_workers},
        "baseline": baseline,
        "levels": levels,
        f"ttfa_growth_{lo}_to_{hi}": round(
            levels[hi]["ours"]["ttfa_ms"]["p50"] / levels[lo]["ours"]["ttfa_ms"]["p50"], 3
        ),
        f"throughput_ratio_c{hi}": levels[hi]["throughput_ratio"],
        "goals": GOALS,
    }
    return report


def summary_lines(report: dict) -> list[str]:
    lines = [
        header_line(report),
        f"transformers generate(return_audio=True), one at a time: {report['baseline']['seconds_per_request']:.2f} s "
        f"per request for {report['baseline']['audio_s_per_request']:.2f} s of audio "
        f"({report['baseline']['throughput_audio_s_per_s']:.2f} audio s/s)",
        f"{'C':>3} {'ours ttfa p50/p95':>18} {'ours rtf p50/p95':>17} {'ours audio s/s':>14} "
        f"{'baseline ttfa p50':>17} {'ratio':>6}",
    ]
    for c, lv in sorted(report["levels"].items(), key=lambda kv: int(kv[0])):
        o = lv["ours"]
        lines.append(
            f"{c:>3} {o['ttfa_ms']['p50']:>8.0f}/{o['ttfa_ms']['p95']:<6.0f}ms {o['rtf']['p50']:>8.2f}/"
            f"{o['rtf']['p95']:<7.2f} {o['throughput_audio_s_per_s']:>14.2f} "
            f"{lv['baseline_sequential']['ttfa_ms']['p50']:>15.0f}ms {lv['throughput_ratio']:>6.2f}x"
        )
    for c, lv in sorted(report["levels"].items(), key=lambda kv: int(kv[0])):
        busy = lv["ours"].get("cpu_cores_busy", {})
        if any(name.startswith("rank") for name in busy):
            lines.append(f"{c:>3} CPU cores busy: " + ", ".join(f"{name} {v:.2f}" for name, v in sorted(busy.items())))
    growth = next(v for k, v in report.items() if k.startswith("ttfa_growth_"))
    ratio = next(v for k, v in report.items() if k.startswith("throughput_ratio_c"))
    g = report["goals"]
    lines.append(
        f"time to first audio growth, lowest to highest concurrency: {growth:.2f}x (goal <= "
        f"{g['ttfa_growth_1_to_8']:g}): {'met' if growth <= g['ttfa_growth_1_to_8'] else 'NOT met'}"
    )
    lines.append(
        f"throughput vs transformers at the highest concurrency: {ratio:.2f}x (goal >= "
        f"{g['throughput_ratio_c8']:g}): {'met' if ratio >= g['throughput_ratio_c8'] else 'NOT met'}"
    )
    return lines
