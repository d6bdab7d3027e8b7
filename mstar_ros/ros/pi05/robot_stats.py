"""What a pi0.5 policy node counts per robot: chunks, drops, outages, latencies (its summary and /diagnostics)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

LATENCY_SAMPLES = 20000


@dataclass
class RobotStats:
    chunks: int = 0
    dropped: int = 0  # bad messages (images, joint states) dropped
    stale_frames: int = 0  # good messages not acted on: stale, future or frozen stamps
    chunks_failed: int = 0
    chunks_discarded: int = 0  # results that came back after a sensor loss stopped the robot
    prompts_refused: int = 0
    observations_refused: int = 0  # complete observations the model could not take (e.g. a state of wrong size)
    sensor_losses: int = 0
    policy_outages: int = 0  # times the policy could not produce chunks (a Worker down, a chunk overdue or failed)
    chunks_overdue: int = 0  # requests cancelled for not coming back within chunk_timeout_s
    stops_published: int = 0  # empty action messages (stop and hold)
    topics_shut: int = 0  # sensor topics unsubscribed for a while: they flooded bad messages
    states_outside_limits: int = 0  # joint states with positions outside the joint limits (used as they are)
    chunks_outside_limits: int = 0  # chunks that leave the joint limits (published as they are)
    # the last LATENCY_SAMPLES chunks (a robot serving for days must not grow them without bound)
    latencies_s: deque = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))  # oldest frame -> published
    published_at: deque = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))  # time.monotonic() of each
    last_error: str = ""
    fresh_waits: int = 0  # requests that waited for a fresher camera frame (wait_for_fresh_frames)
    admission_waits: int = 0  # requests that waited for an in-flight slot (the node set's --max-inflight)
    first_request: float | None = None  # time.monotonic() of the first request (data started flowing)

    def counters(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int) and not isinstance(v, bool)}
