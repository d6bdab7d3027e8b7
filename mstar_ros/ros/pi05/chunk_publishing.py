"""The policy node's output: each chunk back from the runtime, published (a part of PolicyNode).

The chunk is unnormalised with the checkpoint's action statistics and published on
``action_chunk`` as ``action_space`` says (mstar_ros.ros.pi05.action_output), skipping the
actions whose time passed while it was computed: its points start at ``header.stamp``, spaced
1 / rate. A chunk planned from data that then stopped is discarded. Positions outside the
joint limits are reported, never clamped.
"""

from __future__ import annotations

import asyncio
import math
import time

import torch
from rclpy.duration import Duration

from mstar.request import RequestCancelled
from mstar_ros.ros.common.convert import outside_limits
from mstar_ros.ros.pi05.action_output import ActionOutput
from mstar_ros.ros.pi05.params import PolicyParams


class ChunkPublishing:
    """PolicyNode's chunk delivery."""

    def _start_chunk_publishing(self, p: PolicyParams) -> None:
        self._action_limits = self._limits_of_actions(p.action_space)
        self.output = ActionOutput(self, p.action_space, self.action_names, self.rate)

    def _limits_of_actions(self, space: str) -> tuple[list[int], list[str], list[float], list[float]] | None:
        """(columns, names, lower, upper) of the actions that are positions of joints with limits, or None."""
        if space != "joint_positions" or not self.lower:
            return None
        cols = [i for i, n in enumerate(self.action_names) if n in self.joint_names]
        joints = [self.joint_names.index(self.action_names[i]) for i in cols]
        return (
            cols,
            [self.action_names[i] for i in cols],
            [self.lower[j] for j in joints],
            [self.upper[j] for j in joints],
        )

    def _on_chunk(self, future, oldest: float, epoch: int) -> None:
        """On the Conductor's loop thread (rclpy publishers are thread-safe)."""
        try:
            self._deliver(future, oldest, epoch)
        finally:  # outside the node's lock: the freed slot may start another robot's request
            self.admission.release()

    def _deliver(self, future, oldest: float, epoch: int) -> None:
        now = time.monotonic()
        try:
            (chunk,) = future.result()["actions"]
        except Exception as exc:
            return self._chunk_failed(exc, now)
        resumed, outage = None, None
        with self._lock:
            self._busy, self._admitted_at = False, None
            # a sensor loss came in between, or is under way: planned from data that stopped
            if epoch != self._epoch or self.closing or self.watch.lost(now, self._clock_now()):
                self.stats.chunks_discarded += not self.closing
                self.chunker.pending = None
                return
            start_tick, actions = self.chunker.accept(chunk, now)
            start_in = self.chunker.time_of(start_tick) - now
            stamp = (self.get_clock().now() + _duration(max(0.0, start_in))).to_msg()
            raw = self.normalization.action.unnormalize(actions[:, : self.robot_dims])
            self.output.chunk(raw, stamp)
            self.stats.chunks += 1
            outage = self.chunk_watch.end(now)
            published = time.monotonic()
            self.stats.latencies_s.append(published - oldest)
            self.stats.published_at.append(published)
            if self._loss_since is not None:
                resumed, self._loss_since = now - self._loss_since, None
        out = self._actions_outside_limits(raw)
        if out:
            self._problem(
                ("chunk limits", self.get_namespace()),
                f"{self.get_namespace()}: chunk goes outside the joint limits: {', '.join(out)}",
                "WARN",
                count="chunks_outside_limits",
            )
        if resumed is not None:
            self._say(
                f"{self.get_namespace()}: observations and chunks resumed after a {resumed:.1f} s sensor loss", "OK"
            )
        if outage is not None:
            self._say(f"{self.get_namespace()}: chunks resumed after {outage:.1f} s without a policy", "OK")

    def _chunk_failed(self, exc: BaseException, now: float) -> None:
        """No chunk came back: a failure (not a cancel, not while closing) is a policy outage."""
        failed = not self.closing and not isinstance(exc, (RequestCancelled, asyncio.CancelledError))
        with self._lock:  # nothing else is in flight (_busy): its pending request is this one
            self._busy, self._admitted_at, self.chunker.pending = False, None, None
            started = failed and self._begin_outage(now, f"chunk failed: {exc}")
        if failed:
            self._problem(
                ("failed", self.get_namespace()),
                f"{self.get_namespace()}: chunk failed: {exc}",
                "ERROR",
                count="chunks_failed",
            )
        if started:
            self._on_policy_outage()

    def _actions_outside_limits(self, raw: torch.Tensor) -> list[str]:
        if self._action_limits is None:
            return []
        cols, names, lower, upper = self._action_limits
        return outside_limits(names, raw.numpy()[:, cols], lower, upper)


def _duration(seconds: float) -> Duration:
    return Duration(seconds=math.floor(seconds), nanoseconds=int((seconds - math.floor(seconds)) * 1e9))
