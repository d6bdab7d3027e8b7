"""What a BAGEL node counts and says on /diagnostics once a second (a part of BagelNode)."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from mstar_ros.ros.common.diagnostics import publish_status


@dataclass
class BagelStats:
    frames: int = 0  # good camera frames received
    questions: int = 0  # questions taken to the runtime
    answers: int = 0  # answers published
    edits: int = 0  # instructions taken to the runtime
    goals: int = 0  # edited images published on the goal topic
    failed: int = 0  # requests the runtime failed
    dropped: int = 0  # bad messages and refused requests
    busy: int = 0  # of them, questions and instructions refused because their kind's slots were all taken
    topics_shut: int = 0  # times the camera was unsubscribed for a while: it flooded bad frames
    dropped_by_topic: Counter = field(default_factory=Counter)  # the same, by resolved topic name
    answer_latencies_s: deque = field(default_factory=lambda: deque(maxlen=10000))
    edit_latencies_s: deque = field(default_factory=lambda: deque(maxlen=10000))
    last_error: str = ""
    last_drop_at: float = -1e9  # time.monotonic() of the newest drop / failure (for /diagnostics)
    last_failure_at: float = -1e9


RECENT_S = 5.0  # /diagnostics says WARN / ERROR for this long after a drop / a failed request


class BagelStatus:
    """BagelNode's /diagnostics."""

    def _diagnose(self) -> None:
        now = time.monotonic()
        with self._lock:
            repeats = self.throttle.flush(now)
        for _key, text in repeats:  # the count of what was not said yet: nothing is lost silently
            self.get_logger().error(f"{text} (dropped)")
        s = self.stats
        level = "ERROR" if now - s.last_failure_at < RECENT_S else "WARN" if now - s.last_drop_at < RECENT_S else "OK"
        counts = f"{s.frames} frames, {s.answers} answers, {s.goals} goal images"
        publish_status(
            self,
            self.pub_diag,
            f"mstar: {self.get_namespace().rstrip('/')}/{self.get_name()}",
            counts if level == "OK" else f"{counts}; last problem: {s.last_error}",
            "bagel",
            {
                "frames": s.frames,
                "questions": s.questions,
                "answers": s.answers,
                "edits": s.edits,
                "goals": s.goals,
                "failed": s.failed,
                "in_flight": self.pending,
                "messages_dropped": s.dropped,
                "refused_busy": s.busy,
                "topics_shut": s.topics_shut,
                "frames_converted": self.frame.conversions,
                **{f"dropped {topic}": n for topic, n in sorted(s.dropped_by_topic.items())},
            },
            level,
        )
