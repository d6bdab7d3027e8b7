"""``mstar-ros bench rollout``: V-JEPA 2-AC rollouts and plans driven from a bag, persistent KV vs native.

Both run on the device thread (one OpenMP team: other threads get one intra-op thread each).
Ours: the graph on the embedded runtime. A robot's frames extend a session (its context is
computed once, as when frames arrive as messages); a rollout then computes only its H new
frames, attending to the cached K/V. Native (Meta's): every step re-runs the predictor over the
whole context. Same weights, actions and outputs (their difference is reported).

The token-count bound of the speedup, computed in the same run: with C context frames before
the start frame, native step h runs C + h frames and ours one, so ``sum_h (C + h) / H``.
Attention grows with the context as well, so a measured speedup can pass this bound.

Every request here is of class ``batch`` (mstar.priority): an offline rollout, no robot waits for it.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mstar.priority import Priority
from mstar.progress import progress_bar

OFFLINE = Priority.BATCH  # the class of every request of this benchmark

GOALS = {4: 2.5, 15: 5.0, 30: 15.0}  # speedup goals at those horizons (issue 13)
GOAL_FRACTION_OF_BOUND = 0.8


@dataclass
class RolloutBenchOptions:
    bag: Path
    horizons: list[int] = field(default_factory=lambda: [4, 15, 30])
    context: int = 1
    repeats: int = 3
    preset: str = "bench"
    weights: Path | None = None
    fps: float = 4.0
    plan_sessions: list[int] = field(default_factory=lambda: [1, 4])
    plan_samples: int = 32
    plan_topk: int = 8
    plan_iterations: int = 3
    plan_horizon: int = 2
    seed: int = 0
    dtype: str = "auto"  # both systems: they run the same modules


def token_bound(context: int, horizon: int) -> float:
    return sum(context + h for h in range(1, horizon + 1)) / horizon


def _ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def episode_window(episode, start: int, needed: int):
    """``needed`` frames (latents later), states and the actions between them, from ``start``;
    an episode shorter than that is played again from its first frame."""
    from mstar_graphs.vjepa2.pose import pose_delta

    idx = [(start + i) % len(episode.frames) for i in range(needed)]
    states = episode.states[idx]
    return episode.frames[idx], states, pose_delta(states[:-1], states[1:]).float()


def extend_request(latents: torch.Tensor, states: torch.Tensor, actions: torch.Tensor, session: str):
    """A session's context from frames already encoded: ``latents`` [C + 1] and ``states`` [C + 1],
    ``actions`` [C] taken at the first C frames; the last frame stays pending (its action is the
    rollout's first). One extend call: ``actions[0]`` of the call is a pending frame's, none yet."""
    from mstar.request import Request

    return Request(
        {"latents": latents, "states": states, "actions": torch.cat([torch.zeros(1, 7), actions])},
        session_id=session,
        meta={"walk": "extend"},
        priority=OFFLINE,
    )


def rollout_request(actions: torch.Tensor, session: str):
    """The frames ``actions`` [1, H, 7] lead to from the session's context."""
    from mstar.request import Request

    return Request({"actions": actions}, session_id=session, priority=OFFLINE)


def plan_request(goal: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, params, session: str, seed: int):
    """One robot's CEM plan toward ``goal`` (its ``plan`` output only)."""
    from mstar.request import Request
    from mstar.sampling_params import SamplingParams

    return Request(
        {"goal": goal, "mean": mean, "std": std, "params": params.tensor()},
        session_id=session,
        sampling=SamplingParams(seed=seed),
        meta={"iterations": params.iterations},
        outputs=frozenset({"plan"}),
        priority=OFFLINE,
    )


async def _open_session(c, latents: torch.Tensor, states: torch.Tensor, actions: torch.Tensor, session: str) -> None:
    await c.submit(extend_request(latents, states, actions, session)).collect()


class _Systems:
    """The model loaded once; ours on a Conductor, native as plain calls."""

    def __init__(self, opts: RolloutBenchOptions) -> None:
        from mstar.engine.config import EngineConfig
        from mstar_graphs.vjepa2.components import vjepa2_components
        from mstar_graphs.vjepa2.graph import vjepa2_graph

        graph = vjepa2_graph()
        self.graph, self.modules = vjepa2_components(
            {n.name for n in graph.nodes},
            None if opts.weights is None else str(opts.weights),
            opts.preset,
            progress=True,
        )
        self.predictor, self.encoder = self.modules["predictor"], self.modules["encoder"]
        # one KV block per frame: a rollout's context and horizon, or every plan sample's horizon
        blocks = max(
            opts.context + max(opts.horizons),
            max(opts.plan_sessions, default=1) * (opts.context + opts.plan_samples * opts.plan_horizon),
        )
        # a step of about one robot's plan samples: on a CPU, bigger forwards cost more per row (measured
        # 794 ms for 32 samples of one frame vs 904-986 ms per robot with 4 robots in one forward)
        frame_rows = opts.plan_samples * (self.predictor.frame_tokens)
        self.config = EngineConfig(
            num_kv_blocks=blocks + 8, max_num_seqs=1024, max_batched_tokens=max(1024, frame_rows), dtype=opts.dtype
        )

    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        from mstar.engine.device_loop import run_on_device

        def encode() -> torch.Tensor:
            with torch.no_grad():
                return torch.cat([self.encoder(frames=frames[i : i + 8])["latents"] for i in range(0, len(frames), 8)])

        return run_on_device(encode)


async def _rollouts(sys: _Systems, episodes, opts: RolloutBenchOptions, bar) -> list[dict]:
    from mstar.conductor import Conductor
    from mstar.engine.device_loop import run_on_device
    from mstar_graphs.vjepa2.reference import native_rollout

    ep = episodes[0]
    rows = []
    async with Conductor(sys.graph, sys.modules, config=sys.config) as c:
        for H in opts.horizons:
            C = opts.context
            frames, states, actions = episode_window(ep, 0, C + 1 + H)
            latents = sys.encode(frames[: C + 1])
            session = f"h{H}"
            await _open_session(c, latents, states[: C + 1], actions[:C], session)
            roll = actions[C : C + H][None]
            ours, native = [], []
            got = want = None
            for _ in range(opts.repeats):  # interleaved: both systems see the same machine load
                t0 = time.perf_counter()
                got = (await c.submit(rollout_request(roll, session)).collect())["frame"][0]
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                # on the device thread, as our engines run: the same OpenMP team (other threads get one)
                want = run_on_device(native_rollout, sys.predictor, latents, actions[:C], states[: C + 1], roll)[:, -1]
                native.append(time.perf_counter() - t0)
                bar.update(1)
            c.close_session(session)
            speedup, bound = _ms(native) / _ms(ours), token_bound(C, H)
            rows.append(
                {
                    "horizon": H,
                    "context_frames": C,
                    "ours_ms": _ms(ours),
                    "native_ms": _ms(native),
                    "speedup": speedup,
                    "token_bound": bound,
                    "fraction_of_bound": speedup / bound,
                    "max_abs_diff": float((got.float() - want.float()).abs().max()),
                    "ours_runs_ms": [x * 1000 for x in ours],
                    "native_runs_ms": [x * 1000 for x in native],
                }
            )
    return rows


async def _plans(sys: _Systems, episodes, opts: RolloutBenchOptions, bar) -> list[dict]:
    from mstar.conductor import Conductor
    from mstar.engine.device_loop import run_on_device
    from mstar_graphs.vjepa2.planner import CemParams, initial_belief
    from mstar_graphs.vjepa2.reference import native_plan

    params = CemParams(samples=opts.plan_samples, topk=opts.plan_topk, iterations=opts.plan_iterations)
    C, Hp = opts.context, opts.plan_horizon
    rows = []
    for n in opts.plan_sessions:
        robots = []
        for r in range(n):  # robots cycle through the bag's episodes, each from its own start
            ep = episodes[r % len(episodes)]
            frames, states, actions = episode_window(ep, 3 * r, C + 2)
            latents = sys.encode(frames)
            robots.append((latents[: C + 1], states[: C + 1], actions[:C], latents[C + 1]))  # goal: the next frame
        mean, std = initial_belief(Hp, params)
        async with Conductor(sys.graph, sys.modules, config=sys.config) as c:
            for r, (lat, st, act, _goal) in enumerate(robots):
                await _open_session(c, lat, st, act, f"r{r}")
            ours, native, diffs = [], [], []
            for _rep in range(opts.repeats):
                t0 = time.perf_counter()
                outs = await asyncio.gather(
                    *(
                        c.submit(plan_request(goal, mean, std, params, f"r{r}", opts.seed + r)).collect()
                        for r, (_l, _s, _a, goal) in enumerate(robots)
                    )
                )
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                plans = [
                    run_on_device(
                        native_plan, sys.predictor, lat, act, st, goal, params, Hp, opts.seed + r, params.iterations
                    )
                    for r, (lat, st, act, goal) in enumerate(robots)
                ]  # Meta's planner serves one robot at a time
                native.append(time.perf_counter() - t0)
                diffs += [float((o["plan"][-1].float() - p["plan"].float()).abs().max()) for o, p in zip(outs, plans)]
                bar.update(1)
        rows.append(
            {
                "sessions": n,
                "ours_ms_per_action": _ms(ours) / n,
                "native_ms_per_action": _ms(native) / n,
                "speedup": _ms(native) / _ms(ours),
                "max_plan_diff": max(diffs),
                "samples": params.samples,
                "iterations": params.iterations,
                "horizon": Hp,
                "ours_runs_ms": [x * 1000 for x in ours],
                "native_runs_ms": [x * 1000 for x in native],
            }
        )
    return rows


def run_rollout_bench(opts: RolloutBenchOptions) -> dict:
    from mstar.engine.dtype_choice import resolve_dtype
    from mstar.engine.intra_op import model_threads
    from mstar_ros.bag.episodes import read_episodes
    from mstar_ros.bench.machine import dtypes_section, machine_section

    choice = resolve_dtype(opts.dtype)
    episodes = read_episodes(opts.bag, fps=opts.fps)
    sys = _Systems(opts)
    capacity = sys.predictor.max_frames
    for H in opts.horizons:
        if opts.context + H > capacity:
            raise ValueError(
                f"horizon {H} after {opts.context} context frames needs {opts.context + H} frame "
                f"positions; the model holds {capacity}"
            )
    total = opts.repeats * (len(opts.horizons) + len(opts.plan_sessions))
    with progress_bar(total=total, desc="bench rollout", unit="run") as bar:
        rollouts = asyncio.run(_rollouts(sys, episodes, opts, bar))
        plans = asyncio.run(_plans(sys, episodes, opts, bar)) if opts.plan_sessions else []
    c = sys.predictor.config
    report = {
        "model": {
            "preset": opts.preset if opts.weights is None else None,
            "weights": None if opts.weights is None else str(opts.weights),
            "random_weights": opts.weights is None,
            "predictor_width": c.predictor.width,
            "predictor_depth": c.predictor.depth,
            "frame_tokens": c.frame_tokens,
            "max_frames": capacity,
        },
        "bag": str(opts.bag),
        "fps": opts.fps,
        "robots_in_bag": len(episodes),
        "repeats": opts.repeats,
        "rollouts": rollouts,
        "plans": plans,
        "threads": model_threads(),
        "machine": machine_section(),
        "dtypes": dtypes_section(choice, choice.dtype, "the same modules as ours (Meta's rollout and planner code)"),
    }
    for row in rollouts:
        report[f"speedup_h{row['horizon']}"] = row["speedup"]
        goal = GOALS.get(row["horizon"])
        row["goal"] = goal
        row["goal_met"] = (goal is None or row["speedup"] >= goal) and row[
            "fraction_of_bound"
        ] >= GOAL_FRACTION_OF_BOUND
    return report


def summary_lines(report: dict) -> list[str]:
    from mstar_ros.bench.machine import header_line

    lines = [header_line(report), "rollout  H  ctx  ours ms  native ms  speedup  bound  of bound  goal   max|diff|"]
    for r in report["rollouts"]:
        goal = "-" if r["goal"] is None else f"{r['goal']:g}"
        met = "met" if r["goal_met"] else "NOT met"
        lines.append(
            f"        {r['horizon']:>3} {r['context_frames']:>3} {r['ours_ms']:>8.1f} {r['native_ms']:>10.1f} "
            f"{r['speedup']:>7.2f}x {r['token_bound']:>6.2f} {r['fraction_of_bound']:>8.2f}  {goal:>4} {met:<7} "
            f"{r['max_abs_diff']:.1e}"
        )
    for p in report["plans"]:
        lines.append(
            f"plan (CEM {p['samples']} samples x {p['iterations']} iterations, H={p['horizon']}) at "
            f"{p['sessions']} session(s): {p['ours_ms_per_action']:.0f} ms per action vs native "
            f"{p['native_ms_per_action']:.0f} ms ({p['speedup']:.2f}x), plans differ by {p['max_plan_diff']:.1e}"
        )
    if report["model"]["random_weights"]:
        lines.append("(random weights: timing and agreement only, the predictions mean nothing)")
    return lines
