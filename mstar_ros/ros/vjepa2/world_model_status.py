"""What a world-model node counts and says on /diagnostics once a second (a part of WorldModelNode)."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from mstar_ros.ros.common.diagnostics import publish_status


@dataclass
class WorldModelStats:
    frames: int = 0  # frames that extended the session
    frames_skipped: int = 0  # frames replaced by a newer one before the model took them (it was busy)
    dropped: int = 0  # bad messages dropped (images, poses, gripper readings, early goals)
    dropped_by_topic: Counter = field(default_factory=Counter)  # the same, by resolved topic name
    stamps_refused: int = 0  # of those: stamped too far from this node's clock, or a frozen stamp
    topics_shut: int = 0  # sensor topics unsubscribed for a while: they flooded bad messages
    last_plan_seed: int | None = None
    goals: int = 0
    plans: int = 0
    plans_failed: int = 0
    frames_failed: int = 0
    last_energy: float | None = None
    plan_latencies_s: deque = field(default_factory=lambda: deque(maxlen=10000))
    plan_times_s: deque = field(default_factory=lambda: deque(maxlen=10000))  # time.monotonic() of each plan
    last_frame_at: float | None = None  # time.monotonic() of the newest frame taken
    last_error: str = ""
    last_drop_at: float = -1e9  # time.monotonic() of the newest drop / failure (for /diagnostics)
    last_failure_at: float = -1e9


RECENT_S = 5.0  # /diagnostics says WARN / ERROR for this long after a drop / a failed request


class WorldModelStatus:
    """WorldModelNode's /diagnostics."""

    def _diagnose(self) -> None:
        now = time.monotonic()
        with self._lock:
            repeats = self.throttle.flush(now)
        for _key, text in repeats:  # the count of what was not said yet: nothing is lost silently
            self.get_logger().warning(text)
        if self.conductor is None:
            return
        s = self.stats
        silent = s.last_frame_at is not None and now - s.last_frame_at > 2.0 / self.params.fps + 1.0
        level = (
            "ERROR"
            if now - s.last_failure_at < RECENT_S
            else "WARN"
            if now - s.last_drop_at < RECENT_S or silent
            else "OK"
        )
        if silent:
            s.last_error = f"no frame for {now - s.last_frame_at:.1f} s (camera, pose or gripper silent?)"
        message = (
            f"{s.frames} frames, {s.plans} plans"
            if level == "OK"
            else f"{s.frames} frames, {s.plans} plans; last problem: {s.last_error}"
        )
        publish_status(
            self,
            self.pub_diag,
            f"mstar: {self.get_namespace()}/world_model",
            message,
            "vjepa2_ac",
            {
                "frames": s.frames,
                "messages_dropped": s.dropped,
                "last_frame_age_s": "" if s.last_frame_at is None else f"{now - s.last_frame_at:.2f}",
                "frames_skipped": s.frames_skipped,
                "frames_failed": s.frames_failed,
                "goals": s.goals,
                "plans": s.plans,
                "plans_failed": s.plans_failed,
                "stamps_refused": s.stamps_refused,
                "topics_shut": s.topics_shut,
                "last_plan_seed": "" if s.last_plan_seed is None else s.last_plan_seed,
                **{f"dropped {topic}": n for topic, n in sorted(s.dropped_by_topic.items())},
                "last_energy": "" if s.last_energy is None else f"{s.last_energy:.5f}",
                "window_frames": self.window,
                "kv_blocks_used_all_robots": self.conductor.kv_blocks_used() if self.conductor else 0,
            },
            level,
        )
