"""The loads of ``mstar-ros bench pi05``: robots offering observations to ours or to the baseline.

Closed loop: each robot offers its next observation as soon as its previous chunk
returned (aggregate chunks/s at saturation). Open loop: each robot's sensors give an
observation at ``hz``; latency = offer -> chunk. A robot acts on its newest observation:
a frame superseded before the server takes it is dropped (keep-last, like a sensor-data
subscription), so when a system is overloaded the latency stays bounded and
``dropped_fraction`` / ``served_hz`` show the shortfall. With a fresh-frame period (the
policy node's ``wait_for_fresh_frames``, the default) a robot whose newest observation is
past half a period old waits for the next one; the same rule for both systems. Serving
starts only inside the window (frames left at its end count as dropped). Ours may hold
robots to ``max_inflight`` chunks in flight, as the node set's ``--max-inflight`` does.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time

import torch

from mstar.conductor import Conductor
from mstar.engine.device_loop import run_on_device
from mstar_ros.bench.pi05_workload import PROMPT, Observation, Run
from mstar_ros.policy.admission import ChunkAdmission
from mstar_ros.policy.freshness import worth_waiting

clock = time.perf_counter


def request_for(policy, o: Observation):
    return policy.request(o.images, o.state, PROMPT, seed=o.seed)


def direct_call(policy, o: Observation) -> float:
    """One baseline call (tokenising included); returns the bare forward's seconds."""
    from mstar_graphs.pi05.direct import sample_actions_direct

    i = request_for(policy, o).inputs
    start = clock()
    run_on_device(
        synchronized,
        sample_actions_direct,
        policy.model,
        policy.encoder,
        i["images"],
        i["input_ids"],
        i["embed_mask"],
        i["noise"],
    )
    return clock() - start


def synchronized(fn, *args):
    """``fn(*args)``, returning once a GPU has finished it too (kernels run asynchronously)."""
    out = fn(*args)
    if isinstance(out, torch.Tensor) and out.is_cuda:
        torch.cuda.synchronize(out.device)
    return out


def _offers(robots: list[list[Observation]], seconds: float) -> tuple[list[list[Observation]], list[list[float]]]:
    base = min(obs[0].offset_s for obs in robots)
    kept = [[o for o in obs if o.offset_s - base < seconds] for obs in robots]
    return kept, [[o.offset_s - base for o in obs] for obs in kept]


@contextlib.asynccontextmanager
async def admitted(admission: ChunkAdmission, robot: str):
    """Holds one of the node set's in-flight slots (``--max-inflight``), as a policy node does."""
    due = clock()
    while True:
        freed = asyncio.Event()
        if admission.try_acquire(robot, due, freed.set):
            break
        await freed.wait()
    try:
        yield
    finally:
        admission.release()


async def ours_closed(
    policy, conductor: Conductor, robots: list[list[Observation]], seconds: float, bar, max_inflight: int = 0
) -> Run:
    run = Run()
    t0 = clock()
    admission = ChunkAdmission(max_inflight)

    async def robot(r: int, obs: list[Observation]) -> None:
        i = 0
        while clock() - t0 < seconds:
            start = clock()
            async with admitted(admission, str(r)):
                await conductor.submit(request_for(policy, obs[i % len(obs)])).collect()
            run.latencies.append(clock() - start)
            run.elapsed = max(run.elapsed, clock() - t0)
            bar.update()
            i += 1

    await asyncio.gather(*(robot(r, obs) for r, obs in enumerate(robots)))
    return run


def direct_closed(policy, robots: list[list[Observation]], seconds: float, bar) -> Run:
    run = Run()
    t0, i = clock(), 0
    while clock() - t0 < seconds:
        obs = robots[i % len(robots)]
        start = clock()
        run.forward.append(direct_call(policy, obs[(i // len(robots)) % len(obs)]))
        run.latencies.append(clock() - start)
        bar.update()
        i += 1
    run.elapsed = clock() - t0
    return run


def waits_for_next(at: list[float], k: int, now: float, fresh_period_s: float | None) -> bool:
    """Frame policy: with ``fresh_period_s`` a robot whose newest observation ``k`` is past half
    a period waits for the next one (``mstar_ros.policy.freshness``, as the policy node does)."""
    return fresh_period_s is not None and k + 1 < len(at) and worth_waiting(now - at[k], fresh_period_s)


async def ours_open(
    policy,
    conductor: Conductor,
    robots: list[list[Observation]],
    seconds: float,
    bar,
    fresh_period_s: float | None = None,
    max_inflight: int = 0,
    chunk_period_s: float = 0.0,
) -> Run:
    """``chunk_period_s`` > 0: a robot asks for its next chunk no sooner than that long after its last
    request (when it reaches its refill point), not as soon as the last chunk returned."""
    robots, times = _offers(robots, seconds)
    run = Run(offered=sum(map(len, robots)))
    t0 = clock()
    admission = ChunkAdmission(max_inflight)

    async def robot(r: int, obs: list[Observation], at: list[float]) -> None:
        last = -1
        asked = -chunk_period_s  # when this robot last asked (seconds into the window)
        while clock() - t0 < seconds:
            async with admitted(admission, str(r)):  # admitted first, then the observation is picked
                # serving starts inside the window; what is offered after it is dropped
                while (now := clock() - t0) < seconds:
                    if now < asked + chunk_period_s:  # not at its refill point yet
                        await asyncio.sleep(asked + chunk_period_s - now)
                        continue
                    k = bisect.bisect_right(at, now) - 1  # the newest observation offered by now
                    if k <= last or waits_for_next(at, k, now, fresh_period_s):
                        if max(k, last) + 1 == len(at):
                            return
                        await asyncio.sleep(at[max(k, last) + 1] - now)
                        continue
                    asked = now
                    submitted = clock()
                    await conductor.submit(request_for(policy, obs[k])).collect()
                    run.spans.append((submitted, clock()))
                    run.latencies.append(run.spans[-1][1] - t0 - at[k])
                    bar.update()
                    last = k
                    break

    await asyncio.gather(*(robot(r, obs, at) for r, (obs, at) in enumerate(zip(robots, times))))
    run.elapsed = max(seconds, clock() - t0)
    return run


def direct_open(
    policy, robots: list[list[Observation]], seconds: float, bar, fresh_period_s: float | None = None
) -> Run:
    robots, times = _offers(robots, seconds)
    run = Run(offered=sum(map(len, robots)))
    last, served_at = [-1] * len(robots), [0.0] * len(robots)
    t0 = clock()
    while (now := clock() - t0) < seconds:
        newest = [bisect.bisect_right(at, now) - 1 for at in times]
        pending = [
            r
            for r in range(len(robots))
            if newest[r] > last[r] and not waits_for_next(times[r], newest[r], now, fresh_period_s)
        ]
        if not pending:
            upcoming = [at[n + 1] for at, n in zip(times, newest) if n + 1 < len(at)]
            if not upcoming:
                break
            time.sleep(max(0.0, min(upcoming) - now))
            continue
        r = min(pending, key=lambda r: served_at[r])  # one after another: the longest-waiting robot next
        k = last[r] = newest[r]
        run.forward.append(direct_call(policy, robots[r][k]))
        served_at[r] = clock() - t0
        run.latencies.append(served_at[r] - times[r][k])
        bar.update()
    run.elapsed = max(seconds, clock() - t0)
    return run
