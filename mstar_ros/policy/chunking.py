"""One robot's action queue with real-time chunking (RTC, Black et al. 2025).

The robot executes one action per control tick from the chunk it has. When
``refill_at`` actions are left, the next chunk is requested; while it is computed
(``delay`` ticks, estimated from past requests) the robot keeps executing the old
chunk. The request carries the old chunk's remaining actions as a *guide*: the ones
that will surely run before the new chunk lands get weight 1 (the flow keeps them
exactly), the rest of the overlap fades out, so the new chunk continues where the
robot will be instead of jumping at the seam. When the chunk arrives, the actions
that belong to ticks already executed are skipped.

Time is passed in (seconds, any monotonic clock), so the logic is testable without a robot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PendingRequest:
    tick: int  # global tick whose action the new chunk's row 0 is
    sent_at: float


class ActionChunker:
    def __init__(
        self,
        horizon: int,
        action_dim: int,
        rate_hz: float,
        *,
        refill_at: int | None = None,
        smooth: bool = True,
        initial_delay_ticks: int = 2,
    ) -> None:
        if rate_hz <= 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
        self.horizon, self.action_dim, self.rate_hz = horizon, action_dim, rate_hz
        self.refill_at = refill_at if refill_at is not None else horizon // 2
        if not 0 < self.refill_at < horizon:
            raise ValueError(f"refill_at must be in (0, {horizon}), got {self.refill_at}")
        self.smooth = smooth
        self.delay_ticks = float(initial_delay_ticks)  # running estimate of inference delay, in ticks
        self.t0: float | None = None  # clock time of tick 0
        self.chunk: torch.Tensor | None = None  # the actions being executed
        self.chunk_tick = 0  # global tick of chunk row 0
        self.pending: PendingRequest | None = None

    # -- clock ---------------------------------------------------------------------------
    def tick_at(self, now: float) -> int:
        """Global index of the action being executed at ``now``."""
        if self.t0 is None:
            return 0
        return int((now - self.t0) * self.rate_hz)

    def time_of(self, tick: int) -> float:
        assert self.t0 is not None
        return self.t0 + tick / self.rate_hz

    def remaining(self, now: float) -> int:
        if self.chunk is None:
            return 0
        return max(0, self.chunk_tick + self.horizon - self.tick_at(now))

    def reset(self) -> None:
        """The robot stopped (a sensor loss): no chunk, no pending request; the next chunk starts
        afresh (nothing to continue from), and its clock starts again."""
        self.t0, self.chunk, self.chunk_tick, self.pending = None, None, 0, None

    # -- requests --------------------------------------------------------------------------
    def needs_request(self, now: float) -> bool:
        return self.pending is None and self.remaining(now) <= self.refill_at

    def begin_request(self, now: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Marks a request as sent; returns its (guide [H, A], weights [H])."""
        if self.t0 is None:
            self.t0 = now
        start = self.tick_at(now) + 1  # the new chunk's row 0: the tick after the current one
        self.pending = PendingRequest(start, now)
        guide = torch.zeros(self.horizon, self.action_dim)
        weights = torch.zeros(self.horizon)
        if not self.smooth or self.chunk is None:
            return guide, weights
        offset = start - self.chunk_tick
        overlap = max(0, self.horizon - offset)
        if overlap == 0:
            return guide, weights
        guide[:overlap] = self.chunk[offset : offset + overlap]
        frozen = min(overlap, max(1, round(self.delay_ticks)))
        weights[:frozen] = 1.0  # will have run before the chunk lands: keep them exactly
        fade = overlap - frozen
        if fade > 0:  # then hand over gradually (exponential fade as in RTC's soft mask)
            k = torch.arange(1, fade + 1, dtype=torch.float32)
            weights[frozen:overlap] = torch.exp(-3.0 * k / fade) * (1 - k / (fade + 1))
        return guide, weights

    def accept(self, chunk: torch.Tensor, now: float) -> tuple[int, torch.Tensor]:
        """The chunk of the pending request arrived at ``now``: it replaces the queue from the
        next tick on. Returns (global tick of the first action to run, those actions)."""
        if self.pending is None:
            raise RuntimeError("a chunk arrived but no request is pending")
        if tuple(chunk.shape) != (self.horizon, self.action_dim):
            raise ValueError(f"chunk has shape {tuple(chunk.shape)}, expected {(self.horizon, self.action_dim)}")
        start = self.pending.tick
        waited = max(0, self.tick_at(now) + 1 - start)  # rows whose tick has already passed
        self.delay_ticks = 0.7 * self.delay_ticks + 0.3 * (self.tick_at(now) - self.tick_at(self.pending.sent_at) + 1)
        self.pending = None
        self.chunk, self.chunk_tick = chunk.clone(), start
        skip = min(waited, self.horizon - 1)
        return start + skip, self.chunk[skip:]

    def executed_actions(self, upto_tick: int, history: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
        """The actions a robot ran for ticks < ``upto_tick`` given (start tick, actions) publications
        (a later publication replaces an earlier one from its start on)."""
        out: dict[int, torch.Tensor] = {}
        for start, actions in history:
            for i, a in enumerate(actions):
                out[start + i] = a
        return torch.stack([out[t] for t in sorted(out) if t < upto_tick])
