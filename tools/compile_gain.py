"""What ``compile: true`` buys: the AR engine's decode step, eager and compiled, interleaved in one process.

    python tools/compile_gain.py [--preset bench] [--batch 1 4] [--rounds 6] [--steps 100]

Builds two engines on two copies of the generated Orpheus LLM (``--preset``; ``decode``: 108 layers,
its compile takes minutes), one with ``EngineConfig(compile=False)`` and one with ``compile=True``.
For each batch size, ``--rounds`` times in turn: the batch's requests (40-token prompts, Orpheus's
default sampling) are prefilled, 10 steps warm up, then the median of ``--steps`` decode steps (wall
time, on the device thread, as serving steps them). Prints the median of the rounds for each and
their ratio: side by side in one run, as these shared machines need (their figures swing from one
minute to the next).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import msgspec
import torch

from mstar.engine.device_loop import run_on_device
from mstar.engine.messages import ExecuteNode, LoopSpec, ReleaseRequest
from mstar.progress import progress_bar
from mstar_ros.bench.engine_driver import EngineDriver
from mstar_ros.bench.step_overhead import engine_config, load_llm

WARMUP_STEPS = 10


def _round(driver: EngineDriver, batch: int, steps: int, ids: itertools.count) -> float:
    """Median seconds of ``steps`` decode steps of ``batch`` requests decoding together."""
    from mstar_graphs.orpheus.frontend import DEFAULT_SAMPLING

    sampling = msgspec.structs.replace(DEFAULT_SAMPLING, max_tokens=WARMUP_STEPS + steps + 8)
    requests = []
    for row in range(batch):
        n = next(ids)
        request_id = f"r{n}"
        prompt = torch.tensor([(7 * i + row) % 512 for i in range(40)])
        msg = ExecuteNode(
            call_id=n,
            request_id=request_id,
            node="llm",
            inputs={"input_ids": driver.store.put(prompt, owner=request_id)},
            seed=n,
            sampling=sampling,
            loop=LoopSpec(max_iters=WARMUP_STEPS + steps + 4),
        )
        driver.engine.submit(msg, driver.replies.append)
        requests.append(request_id)
    driver.engine.poll()
    for _ in range(WARMUP_STEPS):  # the prefill, then decode steps
        driver.engine.step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        driver.engine.step()
        times.append(time.perf_counter() - started)
    for request_id in requests:
        driver.engine._post(ReleaseRequest(request_id))
    driver.engine.poll()
    driver.replies.clear()
    return statistics.median(times)


def measure(preset: str, batches: list[int], rounds: int, steps: int) -> dict[int, dict[str, float]]:
    drivers = {}
    for compiled in (False, True):
        llm, _ = load_llm(None, preset)
        config = msgspec.structs.replace(engine_config("auto", "none", blocks=64 * max(batches)), compile=compiled)
        drivers["compiled" if compiled else "eager"] = EngineDriver(llm, config)  # compiles while built
    ids = itertools.count(1)
    out: dict[int, dict[str, float]] = {}
    with progress_bar(total=len(batches) * rounds * 2, desc="compile gain: rounds", unit="round") as bar:
        for batch in batches:
            seconds: dict[str, list[float]] = {name: [] for name in drivers}
            for _ in range(rounds):
                for name, driver in drivers.items():
                    seconds[name].append(_round(driver, batch, steps, ids))
                    bar.update()
            out[batch] = {name: 1000 * statistics.median(s) for name, s in seconds.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--preset", default="bench", help="generated Orpheus preset (default bench)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="requests decoding together (1 4)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per batch size and engine, in turn (6)")
    parser.add_argument("--steps", type=int, default=100, help="timed decode steps per round (100)")
    args = parser.parse_args()
    if min(args.batch) < 1 or args.rounds < 1 or args.steps < 1:
        parser.error("--batch, --rounds and --steps must be >= 1")
    result = run_on_device(measure, args.preset, args.batch, args.rounds, args.steps)
    print(f"decode step, ms (median of {args.rounds} rounds of {args.steps} steps; {args.preset} preset):")
    for batch, ms in result.items():
        print(
            f"  B={batch}: eager {ms['eager']:.2f}, compiled {ms['compiled']:.2f} "
            f"-> compiled / eager {ms['compiled'] / ms['eager']:.3f}"
        )


if __name__ == "__main__":
    main()
