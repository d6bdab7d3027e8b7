"""``step_overhead_b1``: one engine decode step (B=1) against the bare forward of the same model.

The engine side is the real AR engine (scheduler, paged KV, attention planning, constrained
sampling, replies) driven step by step on the device thread, decoding one Orpheus request. The
bare side is the same module object (same dtype, packing and quantization the engine gave it) run
on one token against a static, preallocated, contiguous KV cache of the same context length,
followed by the LM head over the same restricted vocabulary: the model's own work and nothing
else. Both run in the same process, on the same thread, interleaved step by step; each side's
figure is the median over rounds of its mean ms per token, and the ratio is taken between those
medians. Wall and this thread's CPU time are both reported: the CPU time is robust to other
processes on shared cores, and complete with one intra-op thread.

The two sides: ``mstar_ros.bench.engine_driver`` and ``mstar_ros.bench.bare_forward``.
What the ratio does not include: waking the device thread between steps and the Conductor's
round trip (an engine-resident Loop has none per token).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import msgspec
import torch

from mstar.engine.config import EngineConfig
from mstar.engine.device_loop import run_on_device
from mstar.layers.vocab_constraint import union_vocab
from mstar.sampling_params import SamplingParams
from mstar_ros.bench.bare_forward import BareForward, StaticKVAttention
from mstar_ros.bench.engine_driver import EngineDriver

WARMUP_STEPS = 4
PROMPT_SEED = 1234


def engine_config(dtype: str, quantization: str, blocks: int) -> EngineConfig:
    fields = {f.name for f in msgspec.structs.fields(EngineConfig)}
    extra = {}
    if quantization != "none":
        if "quantization" not in fields:
            raise ValueError(f"quantization = {quantization!r}: this EngineConfig has no 'quantization' field yet")
        extra["quantization"] = quantization
    return EngineConfig(dtype=dtype, num_kv_blocks=blocks, **extra)


def load_llm(model_dir: Path | None, preset: str):
    from mstar_graphs.orpheus.checkpoints import ensure_tiny_orpheus
    from mstar_graphs.orpheus.frontend import OrpheusLLM

    path = Path(model_dir) if model_dir is not None else ensure_tiny_orpheus(preset).llm
    llm = OrpheusLLM.from_pretrained_dir(path, progress=False).fuse_projections()
    llm.constrain = True
    return llm, path


def _measure(
    model_dir: Path | None,
    dtype: str,
    quantization: str,
    steps: int,
    context: int,
    rounds: int,
    preset: str,
    greedy: bool,
    device: str,
) -> dict:
    from mstar_graphs.orpheus.frontend import DEFAULT_SAMPLING

    llm, path = load_llm(model_dir, preset)
    max_len = context + 1 + WARMUP_STEPS + steps + 1
    config = engine_config(dtype, quantization, blocks=2 * (max_len // 16 + 2))
    driver = EngineDriver(llm, config, device)
    core = driver.engine.core
    module = core.module  # as the engine made it: dtype, packed linears, quantization
    spec = module.kv_spec()
    attn = StaticKVAttention(
        spec.num_layers,
        spec.num_kv_heads,
        spec.head_dim,
        max_len,
        core.cache.dtype,
        getattr(core.backend, "compute_dtype", None),
        core.device,
    )
    sampling = SamplingParams(max_tokens=steps + WARMUP_STEPS + 2) if greedy else DEFAULT_SAMPLING
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    prompt = torch.randint(0, 512, (context,), generator=gen).tolist()  # text-token ids of the toy vocabulary
    vocab = union_vocab([module.allowed_token_ranges(1)], core.device)  # one audio slot, as most steps have
    bare = BareForward(module, attn, vocab)
    walls: dict[str, list[float]] = {"engine": [], "bare": []}
    cpus: dict[str, list[float]] = {"engine": [], "bare": []}
    with torch.inference_mode():
        for _ in range(rounds):
            # interleaved step by step: a load that comes and goes on the shared cores hits both alike
            driver.begin(prompt, 1 + WARMUP_STEPS + steps, sampling)
            spent = {"engine": [], "bare": []}
            for i in range(WARMUP_STEPS + steps):
                position = context + i  # the prefill sampled the token that enters at position ``context``
                pair = {"engine": driver.step(), "bare": bare.step(position)}
                if i >= WARMUP_STEPS:
                    for side, times in pair.items():
                        spent[side].append(times)
            driver.end()
            for side, times in spent.items():
                walls[side].append(1000 * statistics.fmean(t[0] for t in times))
                cpus[side].append(1000 * statistics.fmean(t[1] for t in times))
    engine, bare_ms = statistics.median(walls["engine"]), statistics.median(walls["bare"])
    engine_cpu, bare_cpu = statistics.median(cpus["engine"]), statistics.median(cpus["bare"])
    return {
        "engine_step_ms": round(engine, 3),
        "bare_forward_ms": round(bare_ms, 3),
        "step_overhead_b1": round(engine / bare_ms, 3),
        # this thread's CPU time: robust to other processes' load, complete only with one intra-op thread
        "engine_step_cpu_ms": round(engine_cpu, 3),
        "bare_forward_cpu_ms": round(bare_cpu, 3),
        "step_overhead_b1_cpu": round(engine_cpu / bare_cpu, 3),
        "rounds_engine_ms": [round(x, 3) for x in walls["engine"]],
        "rounds_bare_ms": [round(x, 3) for x in walls["bare"]],
        "dtype": str(core.cache.dtype).removeprefix("torch."),
        "quantization": quantization,
        "context": context,
        "steps": steps,
        "sampling": "greedy" if greedy else "orpheus default (temperature 0.6, top_p 0.8, repetition 1.3)",
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "model_dir": str(path),
        "device": str(core.device),
    }


def measure_step_overhead(
    model_dir: Path | None,
    *,
    dtype: str = "auto",
    quantization: str = "none",
    steps: int = 64,
    context: int = 128,
    rounds: int = 5,
    preset: str = "bench",
    greedy: bool = False,
    device: str = "cpu",
) -> dict:
    """Engine decode step vs bare forward of the Orpheus LLM at B=1, interleaved, on the device thread.

    ``model_dir``: an Orpheus LLM directory (HF layout); None: the generated checkpoint of ``preset``.
    Returns {"engine_step_ms", "bare_forward_ms", "step_overhead_b1", ...} (medians over ``rounds``
    of each side's mean ms per token over ``steps`` decode steps after a warm-up, at ``context``
    tokens of prompt). ``greedy``: greedy sampling instead of Orpheus's default nucleus sampling.
    ``device``: where the engine (and so the bare forward) runs; timings synchronize a CUDA device.
    """
    if steps < 1 or context < 1 or rounds < 1:
        raise ValueError(f"steps, context and rounds must be >= 1, got {steps}, {context}, {rounds}")
    return run_on_device(_measure, model_dir, dtype, quantization, steps, context, rounds, preset, greedy, device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, default=None, help="Orpheus LLM directory (default: generated)")
    parser.add_argument("--preset", default="bench")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    result = measure_step_overhead(
        args.weights,
        dtype=args.dtype,
        quantization=args.quantization,
        steps=args.steps,
        context=args.context,
        rounds=args.rounds,
        preset=args.preset,
        greedy=args.greedy,
        device=args.device,
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
