"""Where a B=1 engine decode step's time goes: the model's forward, and each part of the engine around it.

    python tools/step_profile.py [--steps 64] [--rounds 3] [--greedy] [--context 128] [--cprofile]

Drives the real AR engine over one Orpheus request (bench preset, generated checkpoint) on the
device thread, as ``mstar_ros.bench.step_overhead`` does, with ``time.thread_time`` around each
part of a step (wrapped from outside: nothing in the engine changes):

- schedule: the scheduler's batch (KV blocks appended);
- pack + plan: the runner's tensors and metadata, the attention backend's plan (the runner's time
  outside the module's forward);
- forward: the module's forward;
- lm head: ``compute_logits`` over the restricted vocabulary (the model's work);
- sample: the sampler (penalty, temperature, top-p, the draw);
- rest: replies, tokens fed back, bookkeeping (the step minus all of the above);

and, after each round, the bare forward of ``mstar_ros.bench.step_overhead`` (static KV, one token,
then the LM head) for comparison.

Thread CPU time, not wall: robust to other processes on the shared cores (complete with one intra-op
thread, OMP_NUM_THREADS=1). Prints the median per step of each, over ``rounds`` of ``steps`` steps. ``--cprofile`` also prints
cProfile's top functions for one round (its overhead inflates the Python parts).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from mstar.engine.device_loop import run_on_device
from mstar.layers.vocab_constraint import union_vocab
from mstar.sampling_params import SamplingParams
from mstar_ros.bench.bare_forward import BareForward, StaticKVAttention
from mstar_ros.bench.engine_driver import EngineDriver
from mstar_ros.bench.step_overhead import WARMUP_STEPS, engine_config, load_llm

SECTIONS = ("schedule", "pack + plan", "forward", "lm head", "sample", "rest")


def _timed(spent: dict[str, float], name: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.thread_time() - started

    return wrapper


def profile(steps: int, rounds: int, context: int, greedy: bool, use_cprofile: bool) -> dict[str, float]:
    from mstar_graphs.orpheus.frontend import DEFAULT_SAMPLING

    llm, _ = load_llm(None, "bench")
    driver = EngineDriver(llm, engine_config("auto", "none", blocks=2 * ((context + steps) // 16 + 8)))
    core = driver.engine.core
    spent: dict[str, float] = defaultdict(float)
    core.scheduler.schedule = _timed(spent, "schedule", core.scheduler.schedule)
    core.runner.run = _timed(spent, "runner", core.runner.run)
    module = core.module
    module.forward = _timed(spent, "forward", module.forward)
    module.compute_logits = _timed(spent, "lm head", module.compute_logits)
    core.sampler.sample = _timed(spent, "sample", core.sampler.sample)
    sampling = SamplingParams(max_tokens=steps + WARMUP_STEPS + 2) if greedy else DEFAULT_SAMPLING
    prompt = [(7 * i) % 512 for i in range(context)]
    spec = module.kv_spec()
    attn = StaticKVAttention(
        spec.num_layers,
        spec.num_kv_heads,
        spec.head_dim,
        context + steps + 1,
        core.cache.dtype,
        getattr(core.backend, "compute_dtype", None),
        core.device,
    )
    bare = BareForward(module, attn, union_vocab([module.allowed_token_ranges(1)], core.device))
    per_round: list[dict[str, float]] = []
    with torch.inference_mode():
        driver.decode(prompt, WARMUP_STEPS, steps, sampling)  # warm-up round
        for r in range(rounds):
            profiler = cProfile.Profile() if use_cprofile and r == rounds - 1 else None
            if profiler is not None:
                profiler.enable()
            total = sum(
                cpu for _, cpu in driver.decode(prompt, WARMUP_STEPS, steps, sampling, before_timed=spent.clear)
            )
            if profiler is not None:
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            per_round.append(_sections(spent, total, steps))
            # the bare forward after each round (its calls pass the wrappers too: counted, then cleared)
            per_round[-1]["bare forward + lm head"] = statistics.median(
                1000 * bare.step(context + i)[1] for i in range(steps)
            )
    names = (*SECTIONS, "step", "bare forward + lm head")
    return {name: statistics.median(r[name] for r in per_round) for name in names}


def _sections(spent: dict[str, float], total: float, steps: int) -> dict[str, float]:
    ms = {name: 1000 * spent[name] / steps for name in spent}
    step = 1000 * total / steps
    out = {
        "schedule": ms.get("schedule", 0.0),
        "pack + plan": ms.get("runner", 0.0) - ms.get("forward", 0.0),
        "forward": ms.get("forward", 0.0),
        "lm head": ms.get("lm head", 0.0),
        "sample": ms.get("sample", 0.0),
        "step": step,
    }
    out["rest"] = step - sum(out[name] for name in SECTIONS if name != "rest")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--greedy", action="store_true")
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    result = run_on_device(profile, args.steps, args.rounds, args.context, args.greedy, args.cprofile)
    print(f"B=1 decode step, ms (median of {args.rounds} rounds of {args.steps} steps):")
    for name, value in result.items():
        print(f"  {name:<12} {value:7.3f}")


if __name__ == "__main__":
    main()
