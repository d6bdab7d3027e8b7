"""``mstar-ros bench decode``: Orpheus LLM decode tokens/s, ours (bf16 / fp16 / int8 / int8_dynamic / int4) vs
llama.cpp (F16 / Q8_0 / Q4_K_M).

Workload: C independent greedy streams (C = 1 and 8) of ``new_tokens`` tokens after a short
prompt of token ids; the decode steps after each stream's first token are timed (the prefill is
not), and tokens/s counts every stream's tokens. Both systems run the same checkpoint (the GGUF
files are exported from it: mstar_ros.bench.gguf_export), the same intra-op threads, in
interleaved rounds (ours, llama.cpp, ours, ...) so a slow spell of the machine hits both; each
system's figure is its median round. The default preset ``decode`` keeps the real 3B's share of
the weights in the LM head (~15%), which decides what quantizing the body buys.
"""

from __future__ import annotations

import importlib.metadata
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mstar.engine.device_loop import run_on_device
from mstar.engine.dtype_choice import resolve_dtype
from mstar.engine.intra_op import release_team
from mstar.progress import progress_bar
from mstar_ros.bench.machine import dtypes_section, header_line, machine_section

log = logging.getLogger("mstar_ros.bench")

# system key -> our quantization, or the llama.cpp GGUF kind
OURS = {
    "ours_bf16": "none",
    "ours_fp16": "fp16",
    "ours_int8": "int8",
    "ours_int8_dynamic": "int8_dynamic",
    "ours_int4": "int4",
}
LLAMA = {"llama_f16": "F16", "llama_q8_0": "Q8_0", "llama_q4_k_m": "Q4_K_M"}
# each of ours beside the llama.cpp format it is compared with
PAIRS = [
    ("ours_bf16", "llama_f16"),
    ("ours_fp16", "llama_f16"),
    ("ours_int8", "llama_q8_0"),
    ("ours_int8_dynamic", "llama_q8_0"),
    ("ours_int4", "llama_q4_k_m"),
]
ORDER = list(dict.fromkeys(k for pair in PAIRS for k in pair))  # each round runs them in this order


@dataclass
class DecodeBenchOptions:
    preset: str = "decode"
    weights: Path | None = None
    levels: list[int] = field(default_factory=lambda: [1, 8])
    new_tokens: int = 128
    prompt_tokens: int = 8
    rounds: int = 3
    threads: int = 2
    dtype: str = "auto"  # ours without quantization; quantized variants keep it for what is not quantized
    seed: int = 0
    step_overhead: bool = True
    # ours' forward: "auto" compiles it where it can (bf16, int8, int4; fp16 and int8_dynamic run eager),
    # weights frozen and GEMM kernels tuned (docs/performance.md; minutes per variant on 2 cores); False: eager
    compile: bool | str = "auto"
    # llama.cpp's extra weight buffers (AMX tiles, repacked layouts), its default; None: on unless the CPU
    # has AMX-INT8, where they crashed llama_decode (segfault) for Q8_0 and Q4_K_M (llama_extra_buffers())
    llama_extra_buffers: bool | None = None


def llama_extra_buffers(opts: DecodeBenchOptions) -> bool:
    """Whether llama.cpp runs with its extra weight buffers: ``opts.llama_extra_buffers``, or (None) on
    unless the CPU has AMX-INT8. There, llama-cpp-python 0.3.36 built natively segfaulted in
    llama_decode on the Q8_0 and Q4_K_M files of the decode preset (F16 ran), 2026-12-07."""
    if opts.llama_extra_buffers is not None:
        return opts.llama_extra_buffers
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return not caps.get("amx_int8", False)


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` ids: BOS, then ids from the text range (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    return [[128000, *torch.randint(1000, 120000, (length - 1,), generator=g).tolist()] for _ in range(count)]


def head_share(config: dict) -> dict:
    """Parameter count and the LM head's share of it (a tied head counts once, as the embedding)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads = config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads", heads) * d
    layer = h * heads * d * 2 + h * kv * 2 + 3 * h * i + 2 * h
    head = v * h
    total = config["num_hidden_layers"] * layer + h + head * (1 if config.get("tie_word_embeddings") else 2)
    return {
        "params_m": round(total / 1e6, 1),
        "lm_head_params_m": round(head / 1e6, 1),
        "lm_head_share": round(head / total, 4),
    }


def _step_overhead(llm_dir: Path, dtype: str, quick: bool) -> dict:
    from mstar_ros.bench.step_overhead import measure_step_overhead

    try:
        return measure_step_overhead(llm_dir, dtype=dtype, steps=8 if quick else 64, context=32 if quick else 128)
    except Exception as exc:  # another helper's code: the bench's own figures still stand
        return {"step_overhead_b1": None, "why": f"measure_step_overhead failed: {type(exc).__name__}: {exc}"}


def _versions() -> dict:
    import llama_cpp

    out = {"torch": torch.__version__, "llama_cpp_python": llama_cpp.__version__}
    try:
        out["gguf"] = importlib.metadata.version("gguf")
    except importlib.metadata.PackageNotFoundError:
        out["gguf"] = None
    out["llama_cpp_system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    defaults = llama_cpp.llama_context_default_params()
    out["llama_cpp_settings"] = {
        "api": "low-level: a context with n_seq_max = C, one llama_batch of C sequence ids per step",
        "flash_attn_type": int(defaults.flash_attn_type),  # llama.cpp's default (-1: auto), left as is
        "use_extra_bufts": bool(llama_cpp.llama_model_default_params().use_extra_bufts),  # its default
        "type_k": int(defaults.type_k),
        "type_v": int(defaults.type_v),
    }
    return out


def _agreement(a: list[int], b: list[int]) -> dict:
    """How long two greedy streams agree (random weights: a close race can flip a token and the rest)."""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"first_divergence": first, "of": min(len(a), len(b))}


class _Systems:
    """Ours (one engine per variant, loaded once) and llama.cpp (a context per run: its files are mmapped)."""

    def __init__(self, llm_dir: Path, ggufs: dict[str, Path], opts: DecodeBenchOptions, per_stream: int) -> None:
        from mstar_ros.bench.ours_decode import OursDecoder, engine_config

        self.opts, self.ggufs, self.per_stream = opts, ggufs, per_stream
        self.teams_released = True  # every hand-back of an OpenMP team worked (see run)
        self.ours: dict[str, OursDecoder] = {}
        streams = max(opts.levels)
        try:
            for key, quant in OURS.items():
                config = engine_config(opts.dtype, quant, streams, per_stream, compile=opts.compile)
                self.ours[key] = OursDecoder(llm_dir, config)
        except BaseException:  # the engines already started would keep their device threads
            self.close()
            raise

    def run(self, key: str, batch: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float]:
        if key in self.ours:
            return self.ours[key].greedy(batch, new_tokens)
        from mstar_ros.bench.llama_cpp_runner import LlamaCppDecoder

        # llama.cpp's OpenMP team lives on this thread, in the libgomp torch loaded (the same soname). Two
        # teams in one process exceed the 2 cores, and libgomp then cuts every team's spinning to 100
        # rounds: each parallel region pays a wake-up, which slowed ours 1.6x after llama.cpp had run
        # (docs/performance.md). So each system runs with its team alone: ours handed back before, theirs after.
        self._released(run_on_device(release_team))
        try:
            with LlamaCppDecoder(
                self.ggufs[LLAMA[key]],
                threads=self.opts.threads,
                streams=len(batch),
                per_stream_tokens=self.per_stream,
                extra_buffers=llama_extra_buffers(self.opts),
            ) as llama:
                return llama.greedy(batch, new_tokens)
        finally:
            self._released(release_team())

    def _released(self, ok: bool) -> None:
        if not ok and self.teams_released:
            log.warning("cannot hand back OpenMP teams (not libgomp?): both systems' teams stay alive")
        self.teams_released &= ok

    def close(self) -> None:
        for decoder in self.ours.values():
            decoder.close()


def run_decode_bench(opts: DecodeBenchOptions, quick: bool = False) -> dict:
    """Every figure of the bench as one JSON-able dict (see docs/benchmarks/decode.md)."""
    import json

    from mstar_graphs.orpheus.checkpoints import resolve_paths
    from mstar_ros.bench.gguf_files import ensure_gguf_files

    torch.set_num_threads(opts.threads)  # before the device thread starts: its OpenMP team takes this width
    paths = resolve_paths(opts.weights, None, opts.preset) if opts.weights is None else None
    llm_dir = paths.llm if paths is not None else Path(opts.weights)
    config = json.loads((llm_dir / "config.json").read_text())
    print(f"GGUF files of {llm_dir} (made once, cached) ...")
    ggufs = ensure_gguf_files(llm_dir, opts.threads)
    per_stream = opts.prompt_tokens + opts.new_tokens + 8
    choice = resolve_dtype(opts.dtype, "cpu")
    report: dict = {
        "model": {
            "preset": opts.preset if opts.weights is None else None,
            "weights": str(llm_dir),
            "random_weights": bool(config.get("mstar_random_weights", False)),
            **head_share(config),
            "hidden": config["hidden_size"],
            "layers": config["num_hidden_layers"],
            "vocab": config["vocab_size"],
            "gguf_mb": {k: round(p.stat().st_size / 1e6, 1) for k, p in ggufs.items()},
        },
        "workload": {
            "llama_extra_buffers": llama_extra_buffers(opts),
            "ours_compile": opts.compile,
            "levels": opts.levels,
            "new_tokens": opts.new_tokens,
            "prompt_tokens": opts.prompt_tokens,
            "timed": "decode steps after each stream's first token: (new_tokens - 1) x C tokens",
            "sampling": "greedy over the full vocabulary",
            "rounds": opts.rounds,
            "order": "interleaved per round: " + ", ".join(ORDER),
        },
        "threads": opts.threads,
        "machine": machine_section("cpu"),
        "versions": _versions(),
        "dtypes": dtypes_section(choice, "float16 (GGUF F16) / Q8_0 / Q4_K_M", "llama.cpp's own formats"),
        "levels": {},
    }
    print(header_line(report))
    systems = _Systems(llm_dir, ggufs, opts, per_stream)
    keys = ORDER
    try:
        for c in opts.levels:
            batch = prompts(c, opts.prompt_tokens, opts.seed + c)
            for key in keys:  # warm up: first calls are slow for everyone
                systems.run(key, batch, min(8, opts.new_tokens))
            runs: dict[str, list[float]] = {k: [] for k in keys}
            streams: dict[str, list[list[int]]] = {}
            bar = progress_bar(total=opts.rounds * len(keys), desc=f"decode C={c}", unit="run", leave=False)
            for _ in range(opts.rounds):
                for key in keys:
                    tokens, seconds = systems.run(key, batch, opts.new_tokens)
                    runs[key].append(round((opts.new_tokens - 1) * c / seconds, 2))
                    streams[key] = tokens
                    time.sleep(0.05)  # let the last system's released team threads exit
                    bar.update()
            bar.close()
            report["levels"][str(c)] = _level(runs, streams)
    finally:
        systems.close()
    report["openmp_teams_released"] = systems.teams_released
    report["workload"]["ours_compiled"] = {key: decoder.compiled for key, decoder in systems.ours.items()}
    report.update(_ratios(report))
    if opts.step_overhead:
        report["step_overhead"] = _step_overhead(llm_dir, opts.dtype, quick)
    else:
        report["step_overhead"] = {"step_overhead_b1": None, "why": "skipped (--no-step-overhead)"}
    report["step_overhead_b1"] = report["step_overhead"].get("step_overhead_b1")
    return report


def _level(runs: dict[str, list[float]], streams: dict[str, list[list[int]]]) -> dict:
    level: dict = {
        key: {"tokens_per_s": round(statistics.median(values), 2), "runs_tokens_per_s": values}
        for key, values in runs.items()
    }
    if "ours_bf16" in streams and "llama_f16" in streams:  # same model: greedy streams should agree for a while
        level["agreement_ours_bf16_vs_llama_f16"] = _agreement(streams["ours_bf16"][0], streams["llama_f16"][0])
    return level


def _ratio(level: dict | None, ours: list[str], theirs: str) -> float | None:
    if level is None or theirs not in level:
        return None
    mine = [level[k]["tokens_per_s"] for k in ours if k in level]
    return round(max(mine) / level[theirs]["tokens_per_s"], 3) if mine else None


def _ratios(report: dict) -> dict:
    """The headline ratios (None where a system or level did not run); goals: >= 1, >= 1, >= 2."""
    one, eight = report["levels"].get("1"), report["levels"].get("8")
    out = {
        "int8_vs_q8_c1": _ratio(one, ["ours_int8"], "llama_q8_0"),
        "int8_dynamic_vs_q8_c1": _ratio(one, ["ours_int8_dynamic"], "llama_q8_0"),
        "best_vs_q4km_c1": _ratio(one, list(OURS), "llama_q4_k_m"),
        "best_vs_q4km_c8": _ratio(eight, list(OURS), "llama_q4_k_m"),
        "bf16_vs_f16_c1": _ratio(one, ["ours_bf16"], "llama_f16"),
        "bf16_vs_f16_c8": _ratio(eight, ["ours_bf16"], "llama_f16"),
        "fp16_vs_f16_c1": _ratio(one, ["ours_fp16"], "llama_f16"),
        "fp16_vs_f16_c8": _ratio(eight, ["ours_fp16"], "llama_f16"),
    }
    for level in (one, eight):
        if level is not None:
            best = max((k for k in OURS if k in level), key=lambda k: level[k]["tokens_per_s"], default=None)
            level["best_ours"] = best
    return out


def summary_lines(report: dict) -> list[str]:
    lines = [header_line(report)]
    m = report["model"]
    lines.append(
        f"model: {m['params_m']}M params, LM head {m['lm_head_params_m']}M ({m['lm_head_share']:.1%}), "
        f"hidden {m['hidden']} x {m['layers']} layers, vocab {m['vocab']}"
        + (" -- RANDOM weights" if m["random_weights"] else "")
    )
    for c, level in report["levels"].items():
        lines.append(f"\nC={c}: tokens/s (median of {report['workload']['rounds']} interleaved rounds)")
        for ours, theirs in PAIRS:
            left = f"{level[ours]['tokens_per_s']:>9.1f}" if ours in level else "  (n/a)  "
            right = f"{level[theirs]['tokens_per_s']:>9.1f}" if theirs in level else "  (n/a)  "
            lines.append(f"  {ours:<18}{left}    {theirs:<14}{right}")
    compiled = report["workload"].get("ours_compiled", {})
    if compiled:
        on = [k for k, v in compiled.items() if v]
        off = [k for k, v in compiled.items() if not v]
        lines.append(f"\nours compiled: {', '.join(on) or 'none'}; eager: {', '.join(off) or 'none'}")
    headline = ("int8_vs_q8_c1", "int8_dynamic_vs_q8_c1", "fp16_vs_f16_c1", "best_vs_q4km_c1", "best_vs_q4km_c8")
    for name in (*headline, "step_overhead_b1"):
        value = report.get(name)
        lines.append(f"{name}: {'n/a' if value is None else value}")
    if report["step_overhead_b1"] is None:
        lines.append(f"step_overhead_b1 not measured: {report['step_overhead'].get('why')}")
    return lines
