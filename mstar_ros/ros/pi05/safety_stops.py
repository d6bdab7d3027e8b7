"""When the policy node stops its robot: a sensor loss, or a policy outage (a part of PolicyNode).

A sensor giving nothing fresh for ``sensor_timeout_s`` (mstar_ros.policy.sensor_watch) is a
sensor loss: with ``on_sensor_loss: hold`` the robot is told to hold (an empty action message)
and its queue is dropped. A Worker down, or a chunk overdue or failed
(mstar_ros.policy.chunk_watch), is a policy outage: the robot holds, and an overdue chunk is
cancelled in the runtime. Either one drops what is in flight (a new epoch) and says ERROR until
chunks resume.
"""

from __future__ import annotations

from mstar_ros.policy.chunk_watch import ChunkWatch
from mstar_ros.ros.pi05.params import PolicyParams


class SafetyStops:
    """PolicyNode's sensor-loss and policy-outage handling."""

    def _start_safety(self, p: PolicyParams) -> None:
        self.hold_on_loss = p.on_sensor_loss == "hold"
        # by default one chunk's duration: a chunk later than that has every action in the past
        self.chunk_watch = ChunkWatch(p.chunk_timeout_s or self.policy.action_horizon / self.rate)
        self._epoch = 0  # bumped by each sensor loss
        self._lost_now = False  # the data is lost at this moment (sensor_timeout_s passed)
        self._loss_since: float | None = None  # in a sensor loss since (monotonic), until chunks resume
        self._loss_text = ""

    def _check_loss(self, now: float) -> bool:
        """Under the lock: True when the data goes from fresh to lost now (the caller stops the robot).
        Every such change drops what is in flight, also a second one before chunks resumed."""
        if not self.watch.lost(now, self._clock_now()):
            self._lost_now = False
            return False
        if self._lost_now:
            return False
        self._lost_now = True
        self._epoch += 1  # what is in flight was planned from data that then stopped
        if self._loss_since is None:  # a new loss (not the same one again before chunks resumed)
            self._loss_since = now
            self.stats.sensor_losses += 1
        sensor = self.watch.oldest_sensor(now, self._clock_now())
        self._loss_text = (
            f"{self.get_namespace()}: sensor loss: no fresh data from {sensor} for "
            f"{self.watch.age(now, self._clock_now()):.1f} s (sensor_timeout_s="
            f"{self.watch.timeout_s:g}); "
            + (f"stopped ({self._hold_name}: hold)" if self.hold_on_loss else "the robot finishes its chunk")
        )
        if self.hold_on_loss:
            self.chunker.reset()
        return True

    def _on_sensor_loss(self) -> None:
        if self.hold_on_loss:
            self._hold()
        self._say(self._loss_text, "ERROR")

    def _hold(self) -> None:
        if not self.closing:
            self.output.hold(self.get_clock().now().to_msg())
            self.stats.stops_published += 1

    @property
    def _hold_name(self) -> str:
        return f"empty {self.output.type_name.rpartition('/')[2]}"

    def _check_policy(self, now: float, worker_down: str | None) -> tuple[bool, str | None]:
        """Under the lock: (whether a policy outage starts now: the caller holds the robot, the id of
        an overdue request to cancel). A Worker down or the chunk in flight overdue is an outage."""
        pending = self.chunker.pending if self._busy else None
        why = self.chunk_watch.problem(now, worker_down, pending.sent_at if pending is not None else None)
        if why is None or self.closing:
            return False, None
        overdue = None
        if worker_down is None:  # the chunk in flight is overdue: whatever it brings is too late
            self.stats.chunks_overdue += 1
            overdue = self._inflight_id
        return self._begin_outage(now, why), overdue

    def _begin_outage(self, now: float, why: str) -> bool:
        """Under the lock: the policy cannot produce chunks (``why``). Drops what is in flight and
        empties the action queue (the robot is told to hold); True when the outage starts now."""
        self._epoch += 1
        self.chunker.reset()
        started = self.chunk_watch.begin(now, why)
        self.stats.policy_outages += started
        return started

    def _outage_text(self) -> str:
        return f"{self.get_namespace()}: {self.chunk_watch.why}; stopped ({self._hold_name}: hold)"

    def _on_policy_outage(self) -> None:
        self._hold()
        text = self._outage_text()
        with self._report_lock:
            self.stats.last_error = text
        self._say(text, "ERROR")
