"""``mstar-ros bench orpheus``: our Orpheus serving vs transformers generate() + snac, same run.

Workload: texts of 2-10 words (audio length grows with the text), Poisson arrivals,
at most C requests in flight (C = concurrency). The baselines see the same arrivals:
"sequential" serves one request at a time; "static" takes up to C waiting requests as
one left-padded generate() batch, then decodes each with snac — audio only once the
whole batch is done. Ours streams audio as it is decoded.

These machines are noisy (the same run of either system moves 10-15% from one try to
the next), so ours and the static baseline run ``--repeats`` times in turn at each
level; a system's figures are those of its median-throughput run, and every run's
throughput and paired ratio are kept in the JSON. The sequential baseline runs once
(it is the slowest by far at every level above 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time

import torch

from mstar.conductor import Conductor
from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.engine.dtype_choice import resolve_dtype
from mstar.layers.linear_packing import parameter_count
from mstar.progress import progress_bar
from mstar.sampling_params import SamplingParams
from mstar_ros.bench.machine import dtypes_section, header_line, machine_section
from mstar_ros.bench.workload import JobResult, TTSJob, summarize, tts_workload

log = logging.getLogger("mstar_ros.bench")
SAMPLE_RATE = 24_000


async def _ours(
    tts,
    jobs: list[TTSJob],
    concurrency: int,
    config: EngineConfig,
    conductor: Conductor | None = None,
    label: str = "ours",
) -> tuple[list[JobResult], dict]:
    """Serves ``jobs`` through ``conductor`` (default: embedded, one process)."""
    conductor = conductor or Conductor(tts.graph(), tts.modules(), config=config)
    async with conductor:
        warm = conductor.submit(tts.request("Warm up.", sampling=SamplingParams(max_tokens=35, seed=0)))
        await warm.collect()
        gate = asyncio.Semaphore(concurrency)
        t0 = time.perf_counter()
        results: list[JobResult] = []
        bar = progress_bar(total=len(jobs), desc=f"{label:<6} c={concurrency:<2}", unit="req", leave=False)

        async def one(job: TTSJob) -> None:
            await asyncio.sleep(max(0.0, job.arrival - (time.perf_counter() - t0)))
            async with gate:
                started = time.perf_counter() - t0
                first, samples, tokens = None, 0, 0
                request = tts.request(job.text, sampling=SamplingParams(max_tokens=job.max_tokens, seed=job.index))
                async for out in conductor.submit(request):
                    if out.name == "audio":
                        first = first if first is not None else time.perf_counter() - t0
                        samples += out.data.numel()
                    elif out.name == "tokens":
                        tokens += 1
                results.append(
                    JobResult(job.arrival, started, first, time.perf_counter() - t0, samples / SAMPLE_RATE, tokens)
                )
                bar.update()

        await asyncio.gather(*(one(j) for j in jobs))
        bar.close()
        await conductor.refresh()
        stats = conductor.stats()
    return results, stats


def _baseline(hf, snac_model, tts, jobs: list[TTSJob], batch: int, label: str) -> list[JobResult]:
    from mstar_graphs.orpheus.reference import hf_generate, snac_whole

    results: list[JobResult] = []
    pending = list(jobs)
    bar = progress_bar(total=len(jobs), desc=f"{label:<7}", unit="req", leave=False)
    t0 = time.perf_counter()
    while pending:
        now = time.perf_counter() - t0
        if pending[0].arrival > now:
            time.sleep(pending[0].arrival - now)
            now = time.perf_counter() - t0
        group = [j for j in pending if j.arrival <= now][:batch]
        pending = [j for j in pending if j not in group]
        started = now
        prompts = [tts.prompt_ids(j.text) for j in group]

        counts: list[int] = []

        def serve(group: list = group, prompts: list = prompts, counts: list[int] = counts) -> list[torch.Tensor]:
            outs = hf_generate(hf, prompts, max_new_tokens=max(j.max_tokens for j in group), do_sample=False)
            counts.extend(len(tokens[: job.max_tokens]) for job, tokens in zip(group, outs))
            return [snac_whole(snac_model, tokens[: job.max_tokens]) for job, tokens in zip(group, outs)]

        audio = run_on_device(serve)  # same thread (one OpenMP team) as our engines: a fair fight
        if audio and audio[0].is_cuda:
            torch.cuda.synchronize(audio[0].device)
        done = time.perf_counter() - t0
        for job, wav, n in zip(group, audio, counts):
            results.append(JobResult(job.arrival, started, done, done, wav.numel() / SAMPLE_RATE, n))
        bar.update(len(group))
    bar.close()
    return results


def median_run(runs: list[tuple[dict, dict | None]]) -> tuple[dict, dict | None]:
    """The run with the median throughput (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda run: run[0]["throughput_audio_s_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def _pick_baseline_dtype(tts, paths, device: str = "cpu") -> tuple[torch.dtype, dict[str, float]]:
    """A CPU user would try fp32 and bf16; the faster one is the baseline (measured now)."""
    from mstar_graphs.orpheus.reference import hf_generate, load_hf_llm

    timings = {}
    prompt = [tts.prompt_ids("Calibrate the baseline please.")] * 4
    for dtype in (torch.float32, torch.bfloat16):
        model = run_on_device(lambda dtype=dtype: load_hf_llm(paths.llm, dtype).to(device))
        run_on_device(hf_generate, model, prompt, max_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        run_on_device(hf_generate, model, prompt, max_new_tokens=24, do_sample=False)
        timings[str(dtype).removeprefix("torch.")] = round(time.perf_counter() - start, 3)
    best = min(timings, key=timings.get)
    return getattr(torch, best), timings


def run_orpheus_bench(args: argparse.Namespace) -> int:
    from mstar_graphs.orpheus.frontend import OrpheusTTS
    from mstar_graphs.orpheus.reference import hf_generate, load_hf_llm, load_reference_snac, snac_whole

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    n = 4 if args.quick else args.requests
    rate = args.rate or 10.0
    tts = OrpheusTTS.load(args.weights, args.snac_weights, preset=args.preset, progress=True)
    paths = tts.paths
    device = getattr(args, "device", "cpu")
    base_dtype, calibration = _pick_baseline_dtype(tts, paths, device)
    hf = run_on_device(lambda: load_hf_llm(paths.llm, base_dtype).to(device))
    snac_model = run_on_device(lambda: load_reference_snac(paths.snac).to(device, base_dtype))
    warm = [tts.prompt_ids("Warm up.")]  # first calls are slow for everyone; ours is warmed too
    run_on_device(lambda: snac_whole(snac_model, hf_generate(hf, warm, max_new_tokens=35, do_sample=False)[0]))
    config = EngineConfig(dtype=args.dtype, kv_cache_mb=256)  # auto: the engines decide, as resolve_dtype says
    ours_choice = resolve_dtype(args.dtype, device)
    base_name = str(base_dtype).removeprefix("torch.")
    report: dict = {
        "model": {
            "preset": args.preset if args.weights is None else None,
            "weights": str(paths.llm),
            "random_weights": paths.random_weights,
            "llm_params_m": round(parameter_count(tts.llm) / 1e6, 1),
            "snac_params_m": round(parameter_count(tts.snac) / 1e6, 2),
        },
        "workload": {
            "requests_per_level": n,
            "arrival": f"Poisson, {rate} req/s",
            "texts": "2-10 words",
            "audio_tokens": "7 * (4 + 3 * words)",
            "sampling": "greedy",
            "seed": args.seed,
        },
        "ours": {
            "dtype": ours_choice.dtype,
            "config": {
                "block_size": config.block_size,
                "max_batched_tokens": config.max_batched_tokens,
                "pack_linears": config.pack_linears,
            },
        },
        "baseline": {"dtype": base_name, "calibration_s_24_tokens_b4": calibration},
        "machine": machine_section(device),
        "dtypes": dtypes_section(
            ours_choice,
            base_name,
            f"the faster of float32 and bfloat16 for transformers, timed now (24 tokens, batch 4: {calibration})",
        ),
        "levels": {},
    }
    print(header_line(report))
    placement = getattr(args, "placement", None)
    if placement:
        report["ours"]["placement"] = {"file": str(placement), "text": placement.read_text()}
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {repeats}")
    report["workload"]["repeats"] = repeats
    for c in levels:
        jobs = tts_workload(n, rate, args.seed + c)
        runs: dict[str, list[tuple[dict, dict | None]]] = {"ours": [], "ours_placement": [], "baseline_static": []}
        for _ in range(repeats):  # interleaved, so a slow spell of the machine hits both systems
            ours, stats = asyncio.run(
                _ours(tts, jobs, c, config, Conductor(tts.graph(), tts.modules(), config=config, device=device))
            )
            runs["ours"].append((summarize(ours), stats["workers"]))
            if placement:
                from mstar_graphs.orpheus.components import orpheus_spec

                spec = orpheus_spec(args.weights, args.snac_weights, preset=args.preset)
                placed, stats = asyncio.run(
                    _ours(tts, jobs, c, config, Conductor.distributed(spec, placement, config=config), label="placed")
                )
                runs["ours_placement"].append((summarize(placed), stats["workers"]))
            runs["baseline_static"].append((summarize(_baseline(hf, snac_model, tts, jobs, c, f"static c={c}")), None))
        level: dict = {}
        for row, engine_key in (("ours", "engine"), ("ours_placement", "engine_placement"), ("baseline_static", None)):
            if runs[row]:
                figures, engine = median_run(runs[row])
                level[row] = figures
                level[row + "_runs_audio_s_per_s"] = [f["throughput_audio_s_per_s"] for f, _ in runs[row]]
                if engine_key:
                    level[engine_key] = engine
        level["baseline_sequential"] = summarize(_baseline(hf, snac_model, tts, jobs, 1, f"seq c={c}"))
        best_tp = max(
            level["baseline_sequential"]["throughput_audio_s_per_s"],
            level["baseline_static"]["throughput_audio_s_per_s"],
        )
        best_ttfa = min(level["baseline_sequential"]["ttfa_p50_ms"], level["baseline_static"]["ttfa_p50_ms"])
        seq_tp = level["baseline_sequential"]["throughput_audio_s_per_s"]
        for row, suffix in (("ours", "_one_process"), ("ours_placement", "_placement")):
            if row in level:
                level["throughput_ratio" + suffix] = round(level[row]["throughput_audio_s_per_s"] / best_tp, 3)
                level["throughput_ratio_runs" + suffix] = [  # run i of ours against run i of the baseline
                    round(a / max(b, seq_tp), 3)
                    for a, b in zip(level[row + "_runs_audio_s_per_s"], level["baseline_static_runs_audio_s_per_s"])
                ]
                level["ttfa_ratio" + suffix] = round(level[row]["ttfa_p50_ms"] / best_ttfa, 4)
        best_tokens = max(
            level["baseline_sequential"]["audio_tokens_per_s"], level["baseline_static"]["audio_tokens_per_s"]
        )
        for row, suffix in (("ours", "_one_process"), ("ours_placement", "_placement")):
            if row in level:  # the same work counted in tokens, whatever audio each decode delivers
                level["token_throughput_ratio" + suffix] = round(level[row]["audio_tokens_per_s"] / best_tokens, 3)
        headline = "_placement" if placement else "_one_process"  # the configuration under test
        level["throughput_ratio"] = level["throughput_ratio" + headline]
        level["ttfa_ratio"] = level["ttfa_ratio" + headline]
        level["token_throughput_ratio"] = level["token_throughput_ratio" + headline]
        level["throughput_ratio_runs"] = level["throughput_ratio_runs" + headline]
        report["levels"][str(c)] = level
        _print_level(c, level)
    if "8" in report["levels"]:
        report["throughput_ratio_c8"] = report["levels"]["8"]["throughput_ratio"]
        report["ttfa_ratio_c8"] = report["levels"]["8"]["ttfa_ratio"]
        report["token_throughput_ratio_c8"] = report["levels"]["8"]["token_throughput_ratio"]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    from mstar_ros.bench.plot import plot_orpheus

    plot_orpheus(report, args.plot)
    print(header_line(report))
    print(f"wrote {args.json} and {args.plot}")
    if paths.random_weights:
        print("NOTE: random weights (generated checkpoint): timings are real, the audio is noise.")
    return 0


def _print_level(c: int, level: dict) -> None:
    print(
        f"\nconcurrency {c}: throughput ratio {level['throughput_ratio']:.2f}x (audio), "
        f"{level['token_throughput_ratio']:.2f}x (tokens), TTFA ratio {level['ttfa_ratio']:.3f}"
    )
    if len(level["throughput_ratio_runs"]) > 1:
        print(f"  throughput ratio of each run: {', '.join(f'{r:.2f}x' for r in level['throughput_ratio_runs'])}")
    print(f"  {'system':<20}{'audio s/s':>10}{'tokens/s':>10}{'TTFA p50 ms':>13}{'TTFA p95 ms':>13}{'RTF':>8}")
    for name in ("ours", "ours_placement", "baseline_sequential", "baseline_static"):
        if name not in level:
            continue
        s = level[name]
        print(
            f"  {name:<20}{s['throughput_audio_s_per_s']:>10.3f}{s['audio_tokens_per_s']:>10.1f}{s['ttfa_p50_ms']:>13.0f}{s['ttfa_p95_ms']:>13.0f}{s['rtf_mean']:>8.3f}"
        )
