"""What the policy node says: logs and /diagnostics, problems throttled (a part of PolicyNode).

A problem is counted and said at once, then once per ``report_period_s`` with a count
(mstar.report_throttle). Once a second the robot's state goes to /diagnostics: ERROR in a
sensor loss or a policy outage, WARN while waiting for data or acting on none, else OK.
"""

from __future__ import annotations

import threading
import time

from diagnostic_msgs.msg import DiagnosticArray

from mstar.report_throttle import ReportThrottle
from mstar_ros.ros.common.diagnostics import publish_status
from mstar_ros.ros.pi05.params import PolicyParams


class RobotStatus:
    """PolicyNode's reporting."""

    def _start_status(self, p: PolicyParams) -> None:
        self.throttle = ReportThrottle(p.report_period_s)
        self._levels: dict[object, str] = {}  # throttled problem -> its level (for the repeats' report)
        self._report_lock = threading.Lock()  # the throttle and the counters, from both threads

    def _publish_diagnostics(self) -> None:
        self.diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(1.0, self._publish_status)

    def _problem(self, key, text: str, level: str, *, count: str | None) -> None:
        """Counts a problem and says it, throttled per ``key`` (first at once, then once a period)."""
        if self.closing:
            return
        with self._report_lock:  # callers run on the executor thread and on the Conductor's loop thread
            if count is not None:
                setattr(self.stats, count, getattr(self.stats, count) + 1)
            self.stats.last_error = text
            self._levels[key] = level
            said = self.throttle.report(key, text, time.monotonic())
        if said is not None:
            self._say(said, level)

    def _values(self) -> dict[str, object]:
        return {**self.stats.counters(), "normalisation": self.normalization.describe()}

    def _say(self, text: str, level: str) -> None:
        if self.closing:
            return
        logger = self.get_logger()  # one call site per severity: rclpy refuses to mix them at one
        if level == "OK":
            logger.info(text)
        elif level == "WARN":
            logger.warning(text)
        else:
            logger.error(text)
        publish_status(
            self,
            self.diag_pub,
            f"mstar: {self.get_fully_qualified_name()}",
            text,
            self.get_namespace(),
            self._values(),
            level=level,
        )

    def _publish_status(self) -> None:
        """Once a second: the robot's state (ERROR while in a sensor loss), and throttled repeats."""
        with self._report_lock:
            repeats = [(text, self._levels.get(key, "WARN")) for key, text in self.throttle.flush(time.monotonic())]
        for text, level in repeats:
            self._say(text, level)
        if self.closing:
            return
        now, clock = time.monotonic(), self._clock_now()
        with self._lock:
            if self._loss_since is not None:
                level, text = "ERROR", self._loss_text
            elif self.chunk_watch.active:
                level, text = "ERROR", self._outage_text()
            elif not self.watch.has_all():
                level, text = "WARN", f"waiting for data from {self.watch.oldest_sensor(now, clock)}"
            elif self.watch.age(now, clock) > self.watch.max_age_s:
                level, text = (
                    "WARN",
                    (
                        f"sensor data is {self.watch.age(now, clock):.1f} s old "
                        f"({self.watch.oldest_sensor(now, clock)}): not acted on"
                    ),
                )
            else:
                level, text = "OK", "serving"
        publish_status(
            self,
            self.diag_pub,
            f"mstar: {self.get_fully_qualified_name()}",
            text,
            self.get_namespace(),
            self._values(),
            level=level,
        )
