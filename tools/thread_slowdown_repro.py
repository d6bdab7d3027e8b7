"""Why model calls slow down after parallel torch work on another thread (issue 16), on plain threads.

    python tools/thread_slowdown_repro.py [--rounds 6] [--variants default,spincount,...] [--contend N]
                                          [--json out.json]

Each variant runs in a fresh process: a forward-like workload (8 bf16 MLP blocks with RMS
norms on 64 rows, flow-step sized) on a dedicated "device" thread, timed

- fresh: before any other thread of the process ran torch work;
- then in interleaved rounds A, B, A, B, ...: A with no other thread holding an OpenMP
  team, B while a live helper thread has run one parallel torch op (``torch.stack`` of two
  224x224 camera frames, as ``bench pi05`` builds observations) and waits; the helper exits
  after its B round, which frees its team (libgomp joins a team's threads when its thread exits);
- main: after the main thread ran that same op (it never exits: the bench's case).

Printed per variant: medians, B/A and main/A ratios, voluntary context switches per forward
(all threads of the process) and OS threads in A and B. Measured on the 2-core machine
(2026-12, quiet; timings swing, the counts do not):

- default: B/A 1.18, 3 -> 432 context switches per forward: each barrier of the device team
  now sleeps in the kernel instead of spinning. B has one OS thread more than the helper: its
  OpenMP worker. (The real pi0.5 forward has more, shorter regions: 1.45-1.7x, ``bench threads``.)
- exits-first (the helper exits before B): 0.99, 3 -> 3: nothing outlives the team (no
  allocator arena, oneDNN cache or denormal state): the live team is the cause.
- releases (the helper stays but hands its team back, omp_pause_resource_all): 0.99, 3 -> 3.
- one-thread (the helper calls torch.set_num_threads(1) first; it is per thread): 1.00, 3 -> 3.
- spincount (GOMP_SPINCOUNT=10000, the pi0.5 node set's): 1.12, 4 -> 428: the env does not
  stop it. passive (OMP_WAIT_POLICY=PASSIVE): 1.00 only because A sleeps as B does (433 ->
  433; A 20% slower than default's). active: 1.10, 3 -> 229 (throttled it spins 1000, not 100).
- arena (MALLOC_ARENA_MAX=1) 1.16, fp32 1.23, flush-denormal 1.23, all 3 -> ~430: not the cause.
- mstar, the runtime's device thread (mstar.engine.device_loop, the fix): 1.00, 3 -> 3, and
  the helper runs on one thread (no worker); mstar-spincount the same with GOMP_SPINCOUNT=10000.

With ``--contend 2`` (two busy processes on the 2 cores) the trade-off turns: default A (300000
spins) 384 ms vs B (throttled, 100 spins) 293 ms; spincount A 262 vs B 273; mstar 413/393,
mstar-spincount 208/278. Spinning long loses when other processes want the cores, which is why
the node set sets GOMP_SPINCOUNT=10000; the fix keeps whatever spinning was chosen from being
cut to 100 by another thread's torch work.

The cause, read in libgomp (config/linux/wait.h, team.c, env.c): every thread that starts a
parallel region gets its own team, kept until the thread exits; ``gomp_managed_threads``
counts them all, and once it exceeds the cores every barrier of every team spins
``gomp_throttled_spin_count_var`` times (100; 1000 with OMP_WAIT_POLICY=ACTIVE) instead of
GOMP_SPINCOUNT (300000 unless set) before a futex sleep.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from mstar_ros.bench.thread_probe import HelperThread, os_threads, settled_threads, voluntary_switches

VARIANTS = {  # name: (extra environment, child options)
    "default": ({}, []),
    "exits-first": ({}, ["--helper", "exits-first"]),
    "releases": ({}, ["--helper", "releases"]),
    "one-thread": ({}, ["--helper", "one-thread"]),
    "spincount": ({"GOMP_SPINCOUNT": "10000"}, []),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "active": ({"OMP_WAIT_POLICY": "ACTIVE"}, []),
    "arena": ({"MALLOC_ARENA_MAX": "1"}, []),
    "fp32": ({}, ["--dtype", "float32"]),
    "flush-denormal": ({}, ["--flush-denormal"]),
    "mstar": ({}, ["--device-thread", "mstar"]),
    "mstar-spincount": ({"GOMP_SPINCOUNT": "10000"}, ["--device-thread", "mstar"]),
}
_OMP_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MALLOC_ARENA_MAX")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="A/B rounds per variant (default 6)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--json", help="also write every variant's figures to this file")
    parser.add_argument(
        "--contend",
        type=int,
        default=0,
        metavar="N",
        help="N busy processes (a Python spin loop each) share the cores while a variant runs",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--helper", default="stays", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    parser.add_argument("--flush-denormal", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device-thread", default="plain", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}")
    print(
        f"{'variant':<15} {'fresh':>7} {'A':>7} {'B':>7} {'B/A':>6} {'main/A':>7}  switches/forward A, B   "
        "OS threads A, B"
    )
    results = {}
    for name in names:
        extra_env, options = VARIANTS[name]
        env = {k: v for k, v in os.environ.items() if k not in _OMP_ENV} | extra_env
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.contend)]
        try:
            run = subprocess.run(
                [sys.executable, __file__, "--child", "--rounds", str(args.rounds), *options],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
        if run.returncode != 0:
            print(f"{name:<15} failed: {run.stderr.strip()[-500:]}")
            continue
        r = results[name] = json.loads(run.stdout.strip().splitlines()[-1])
        print(
            f"{name:<15} {r['fresh_ms']:7.1f} {r['a_ms']:7.1f} {r['b_ms']:7.1f} {r['b_over_a']:6.2f} "
            f"{r['main_over_a']:7.2f}  {r['switches_a']:8.0f} {r['switches_b']:8.0f}   {r['threads_a']:4d} "
            f"{r['threads_b']:4d}   (device thread width {r['device_width']}, helper {r['helper_width']})"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0 if len(results) == len(names) else 1


def child(args: argparse.Namespace) -> dict:
    import torch
    import torch.nn.functional as F

    call = _device_thread(args.device_thread)
    dtype = getattr(torch, args.dtype)

    rows, width = 64, 1024  # flow-step sized (pi0.5's 50-row action chunks): many short parallel regions

    def setup():
        if args.flush_denormal:
            torch.set_flush_denormal(True)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, width, generator=g).to(dtype)
        layers = [
            (
                (torch.randn(4 * width, width, generator=g) * 0.02).to(dtype),
                (torch.randn(width, 4 * width, generator=g) * 0.02).to(dtype),
            )
            for _ in range(8)
        ]
        return x, layers

    x, layers = call(setup)

    def forward() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for _ in range(3):
                h = x
                for w1, w2 in layers:
                    n = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype)
                    u = F.linear(n, w1)
                    h = h + F.linear(F.silu(u) * u, w2)
        return time.perf_counter() - start

    frames = call(lambda: [torch.zeros(224, 224, 3, dtype=torch.uint8) for _ in range(2)])  # filling is parallel too

    def trigger() -> None:  # 301,056 elements: above torch's grain size, so an OpenMP parallel region
        torch.stack(frames)

    def timed() -> tuple[float, int]:
        before = voluntary_switches()
        seconds = call(forward)
        return seconds, voluntary_switches() - before

    for _ in range(3):
        call(forward)
    fresh = [timed() for _ in range(5)]
    a, b, threads_a, threads_b, helper_width = [], [], [], [], 0
    for _ in range(args.rounds):
        threads_a.append(settled_threads())
        a += [timed() for _ in range(3)]
        helper = _helper(trigger, args.helper)
        threads_b.append(os_threads())
        b += [timed() for _ in range(3)]
        helper_width = helper.width
        helper.close()
    threads_a.append(settled_threads())
    a += [timed() for _ in range(3)]
    trigger()  # on the main thread, which never exits
    main = [timed() for _ in range(6)]

    def med(runs, i=0):
        return statistics.median(r[i] for r in runs)

    return {
        "fresh_ms": med(fresh) * 1e3,
        "a_ms": med(a) * 1e3,
        "b_ms": med(b) * 1e3,
        "b_over_a": med(b) / med(a),
        "main_over_a": med(main) / med(a),
        "switches_a": med(a, 1),
        "switches_b": med(b, 1),
        "threads_a": min(threads_a),
        "threads_b": max(threads_b),
        "helper_width": helper_width,
        "device_width": call(torch.get_num_threads),
    }


def _helper(work, how: str) -> HelperThread:
    """stays: a live thread that ran ``work``; one-thread: it set torch.set_num_threads(1) first
    (per thread); releases: it handed its team back after; exits-first: it has exited."""
    import torch

    before = (lambda: torch.set_num_threads(1)) if how == "one-thread" else None
    after = (lambda: _libgomp().omp_pause_resource_all(1)) if how == "releases" else None  # omp_pause_soft
    helper = HelperThread(work, before=before, after=after)
    if how == "exits-first":
        helper.close()
        settled_threads()
    return helper


def _device_thread(kind: str):
    """``call(fn)`` runs ``fn`` on the dedicated thread and returns its result."""
    if kind == "mstar":
        from mstar.engine.device_loop import run_on_device

        return run_on_device
    import queue

    calls: queue.SimpleQueue = queue.SimpleQueue()

    def serve() -> None:
        while True:
            fn, out = calls.get()
            out.put(fn())

    threading.Thread(target=serve, daemon=True).start()

    def call(fn):
        out: queue.SimpleQueue = queue.SimpleQueue()
        calls.put((fn, out))
        return out.get()

    return call


def _libgomp():
    import ctypes

    import torch

    return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1"))


if __name__ == "__main__":
    sys.exit(main())
