"""``bag play --clock``: the recording's time on ``/clock`` (rosgraph_msgs/Clock), as ``ros2 bag play --clock``.

Nodes started with ``use_sim_time:=true`` take their time from ``/clock``, so messages replayed with
their recorded ``header.stamp`` are as old by those nodes' clocks as they were when recorded. The
player says which bag time it is playing: at ``hz`` a second (default 40, as ``ros2 bag play``),
the bag's start time plus the playback time elapsed since the pass began times ``--rate``. With
``--loop`` each pass starts the clock over at the bag's start, as ``ros2 bag play --loop --clock``
does (the recorded stamps start over too).
"""

from __future__ import annotations

import math

CLOCK_TOPIC = "/clock"
DEFAULT_HZ = 40.0


class BagClock:
    """Publishes the bag time being played on ``/clock`` at ``hz``; the player calls :meth:`tick` while it
    plays and sleeps (its monotonic time in, the seconds until the next publication out)."""

    def __init__(self, node, hz: float, bag_start_ns: int, rate: float) -> None:
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock

        if not (hz > 0 and math.isfinite(hz)):
            raise ValueError(f"--clock: the rate must be a positive number of Hz, got {hz}")
        self._message = Clock
        # reliable matches every subscriber (rclpy's TimeSource subscribes best effort); only the latest matters
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST,
            depth=1,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.VOLATILE,
        )
        self.publisher = node.create_publisher(Clock, CLOCK_TOPIC, qos)
        self.period, self.bag_start_ns, self.rate = 1.0 / hz, bag_start_ns, rate
        self.origin = 0.0  # monotonic time at which this pass plays the bag's start
        self.next_at = math.inf
        self.published = 0

    def publish_start(self) -> None:
        """The bag's start time, once, before playback: nodes on sim time have a clock when data arrives."""
        self._publish(self.bag_start_ns)

    def _publish(self, bag_ns: int) -> None:
        msg = self._message()
        msg.clock.sec, msg.clock.nanosec = divmod(bag_ns, 10**9)
        self.publisher.publish(msg)
        self.published += 1

    def start_pass(self, origin: float) -> None:
        """A pass begins: the bag's start plays at monotonic time ``origin``; the clock says it at once."""
        self.origin, self.next_at = origin, origin

    def bag_time_ns(self, now: float) -> int:
        return self.bag_start_ns + max(0, round((now - self.origin) * self.rate * 1e9))

    def tick(self, now: float) -> float:
        """Publishes the bag time if it is due at ``now``; returns the seconds until the next is due."""
        if now >= self.next_at:
            self._publish(self.bag_time_ns(now))
            # the next tick on the grid from the pass start: a late tick never shifts the ones after it
            self.next_at = self.origin + (math.floor((now - self.origin) / self.period) + 1) * self.period
        return self.next_at - now
