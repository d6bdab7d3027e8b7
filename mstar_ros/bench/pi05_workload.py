"""Observations for ``mstar-ros bench pi05``, taken from the synthetic DROID-like bag, and latency stats.

Each robot namespace of the bag (two cameras at 15 Hz, joint states at 30 Hz) is sampled
at ``hz``: at every tick the robot's observation is its newest frame of each camera and
its newest joint state received by then (bag receive times), converted the way the
policy node converts them (``mstar_ros.ros.common.convert``: uint8 RGB images, joint positions
in the configured order, normalised as the policy node normalises them: ``normalize``, the
checkpoint's state normaliser). Ticks start when a robot has
every input, so robots are offset by their sensors' recorded phases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mstar_ros.bag.synthetic import JOINT_NAMES, SyntheticBagSpec, camera_topic, joint_topic, synthetic_messages
from mstar_ros.bench.workload import percentile
from mstar_ros.ros.common.convert import image_to_tensor, joint_state_to_tensor
from mstar_ros.ros.pi05.params import PARAMETERS

PROMPT = PARAMETERS["prompt"][0]


@dataclass(frozen=True)
class Observation:
    robot: int
    index: int
    offset_s: float  # tick time, seconds after the bag's start
    images: torch.Tensor  # uint8 [cameras, H, W, 3]
    state: torch.Tensor  # [joints], normalised (by the checkpoint's statistics)

    @property
    def seed(self) -> int:  # the flow's noise: the same for every system that serves this observation
        return self.robot * 100_003 + self.index


def bag_observations(
    robots: int,
    seconds: float,
    hz: float = 10.0,
    seed: int = 0,
    normalize: Callable[[torch.Tensor], torch.Tensor] = lambda s: s,
) -> list[list[Observation]]:
    """Per robot, its observations at ``hz`` over ``seconds`` of the synthetic bag (states through ``normalize``)."""
    spec = SyntheticBagSpec(robots=robots, seconds=seconds, seed=seed)
    cams = {camera_topic(ns, c): (r, i) for r, ns in enumerate(spec.namespaces) for i, c in enumerate(spec.cameras)}
    joints = {joint_topic(ns): r for r, ns in enumerate(spec.namespaces)}
    images: list[list[torch.Tensor | None]] = [[None] * len(spec.cameras) for _ in range(robots)]
    states: list[torch.Tensor | None] = [None] * robots
    next_tick: list[float] = [math.inf] * robots
    out: list[list[Observation]] = [[] for _ in range(robots)]
    period_ns = 1e9 / hz

    def emit_until(now_ns: float) -> None:
        for r in range(robots):
            while next_tick[r] <= now_ns:
                state = states[r]
                assert state is not None
                out[r].append(
                    Observation(r, len(out[r]), (next_tick[r] - spec.start_ns) / 1e9, torch.stack(images[r]), state)
                )  # type: ignore[arg-type]
                next_tick[r] += period_ns

    for m in synthetic_messages(spec):
        emit_until(m.timestamp_ns)
        if m.topic in cams:
            r, i = cams[m.topic]
            images[r][i] = image_to_tensor(m.msg, topic=m.topic, expect_hw=(spec.height, spec.width))
        else:
            r = joints[m.topic]
            states[r] = normalize(joint_state_to_tensor(m.msg, JOINT_NAMES, topic=m.topic))
        if next_tick[r] == math.inf and states[r] is not None and all(x is not None for x in images[r]):
            next_tick[r] = float(m.timestamp_ns)  # the robot's first complete observation
    emit_until(spec.start_ns + seconds * 1e9)
    return out


@dataclass
class Run:
    """What one system did in one or more measurement slices (merged with ``+=``)."""

    latencies: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)  # the baseline's bare forwards
    elapsed: float = 0.0  # closed loop: start -> last chunk; open loop: first offer -> last chunk
    offered: int = 0  # open loop only
    spans: list[tuple[float, float]] = field(default_factory=list)  # ours, open loop: each chunk's submit, result

    def __iadd__(self, other: Run) -> Run:
        self.latencies += other.latencies
        self.forward += other.forward
        self.elapsed += other.elapsed
        self.offered += other.offered
        self.spans += other.spans
        return self


def closed_summary(run: Run) -> dict[str, float]:
    chunks = len(run.latencies)
    return {
        "chunks": chunks,
        "seconds": round(run.elapsed, 3),
        "chunks_per_s": round(chunks / run.elapsed, 4),
        "chunk_latency_p50_ms": _ms(percentile(run.latencies, 50)),
        "chunk_latency_p95_ms": _ms(percentile(run.latencies, 95)),
    }


def open_summary(run: Run, robots: int, hz: float) -> dict[str, float | bool]:
    served, offered = len(run.latencies), run.offered
    dropped = offered - served
    return {
        "offered": offered,
        "served": served,
        "dropped": dropped,
        "offered_hz": round(robots * hz, 2),
        "served_hz": round(served / run.elapsed, 3),
        "chunks_per_robot_per_s": round(served / run.elapsed / robots, 3),
        "dropped_fraction": round(dropped / max(offered, 1), 4),
        "overloaded": dropped > 0.05 * offered,
        "latency_p50_ms": _ms(percentile(run.latencies, 50)),
        "latency_p95_ms": _ms(percentile(run.latencies, 95)),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


_COUNTERS = ("steps", "tokens_computed", "busy_ms", "forward_ms", "batches", "calls")


def engine_delta(before: dict, after: dict) -> dict:
    """What each engine did during one level (its counters are cumulative)."""
    return {
        eng: {k: v - before.get(eng, {}).get(k, 0) for k, v in figures.items() if k in _COUNTERS}
        for eng, figures in after.items()
    }
