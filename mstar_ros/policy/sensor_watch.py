"""Is a robot's sensor data fit to act on? Age by ``header.stamp`` and by arrival, frozen drivers, sensor loss.

Per sensor (a camera topic, the joint states) this keeps the newest *good* message:

- a message stamped more than ``max_age_s`` before the node's clock (a lagging driver, a bag
  replayed with its recorded stamps) is ``stale``, and one stamped more than that ahead of it is
  ``future`` (clocks out of step): neither is acted on;
- a camera that sends the same stamp again has stopped (a frozen driver repeats its last
  frame): ``frozen``, not acted on;
- a stamp of zero is ``unstamped``: such a sensor is judged by arrival alone.

The data a request would use is as old as its oldest sensor's newest good message, by
arrival or by stamp, whichever is older. After the robot was fed once, data older than
``timeout_s`` is a sensor loss (the node then stops the robot), until every sensor is good
again. Times are passed in (monotonic seconds, and the ROS clock's seconds), so this is
testable without ROS.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    kind: str  # "ok" | "unstamped" | "stale" | "future" | "frozen"
    text: str = ""

    @property
    def usable(self) -> bool:
        return self.kind in ("ok", "unstamped")


@dataclass
class _Newest:
    arrival: float  # time.monotonic() it arrived
    stamp: float | None  # its header.stamp on the ROS clock (None: unstamped)


class SensorWatch:
    def __init__(self, sensors: Iterable[str], max_age_s: float, timeout_s: float) -> None:
        if not (max_age_s > 0 and timeout_s > 0):
            raise ValueError(f"max_age_s and timeout_s must be > 0, got {max_age_s} and {timeout_s}")
        self.sensors = tuple(sensors)
        self.max_age_s, self.timeout_s = max_age_s, timeout_s
        self._newest: dict[str, _Newest] = {}
        self._last_stamp: dict[str, float] = {}
        self.fed_once = False

    def check(self, sensor: str, stamp: float, clock_now: float) -> Verdict:
        """The verdict on a new message of ``sensor`` stamped ``stamp`` (seconds; 0: no stamp)."""
        if stamp == 0:
            return Verdict(
                "unstamped", f"{sensor}: messages carry no header.stamp: their age is judged by arrival only"
            )
        age = clock_now - stamp
        if age > self.max_age_s:
            return Verdict(
                "stale",
                f"{sensor}: stamped {age:.2f} s ago, over max_observation_age_s="
                f"{self.max_age_s:g} (a lagging driver, or a bag replayed with its recorded "
                "stamps: restamp it or use sim time); not acted on",
            )
        if -age > self.max_age_s:
            return Verdict(
                "future",
                f"{sensor}: stamped {-age:.2f} s ahead of this node's clock (clocks out of step?); not acted on",
            )
        if self._last_stamp.get(sensor) == stamp:
            return Verdict(
                "frozen", f"{sensor}: the same header.stamp again ({stamp:.3f}): a frozen driver? not acted on"
            )
        return Verdict("ok")

    def accept(self, sensor: str, stamp: float, arrival: float) -> None:
        """Record a usable message as the sensor's newest."""
        self._newest[sensor] = _Newest(arrival, stamp or None)
        if stamp:
            self._last_stamp[sensor] = stamp
        if not self.fed_once and all(s in self._newest for s in self.sensors):
            self.fed_once = True

    def has_all(self) -> bool:
        return all(s in self._newest for s in self.sensors)

    def age(self, now: float, clock_now: float) -> float:
        """How old the data a request would use is (inf while a sensor has given nothing good)."""
        if not self.has_all():
            return float("inf")
        ages = []
        for s in self.sensors:
            newest = self._newest[s]
            ages.append(max(now - newest.arrival, clock_now - newest.stamp if newest.stamp is not None else 0.0))
        return max(ages)

    def oldest_sensor(self, now: float, clock_now: float) -> str:
        """The sensor whose data is oldest (for messages)."""
        missing = [s for s in self.sensors if s not in self._newest]
        if missing:
            return missing[0]
        return max(
            self.sensors,
            key=lambda s: max(now - self._newest[s].arrival, clock_now - (self._newest[s].stamp or clock_now)),
        )

    def oldest_arrival(self) -> float:
        return min(self._newest[s].arrival for s in self.sensors)

    def lost(self, now: float, clock_now: float) -> bool:
        """A sensor loss: fed once, and the data is older than ``timeout_s`` now."""
        return self.fed_once and self.age(now, clock_now) > self.timeout_s
