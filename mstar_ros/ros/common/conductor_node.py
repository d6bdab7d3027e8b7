"""The Conductor as a ROS 2 node: its runtime state, and each Worker by rank, on /diagnostics.

Once a second, and at once when a Worker's state changes (a rank going down is news for a
robot's supervisor, not a thing to learn a second later): one DiagnosticArray with the
Conductor's status (level: the worst of its Workers') and one status per rank
(``mstar_ros.ros.common.worker_health``). Imports rclpy: import it where ROS runs.
"""

from __future__ import annotations

import time

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node

from mstar.conductor import Conductor
from mstar_ros.ros.common.diagnostics import make_status, publish_statuses
from mstar_ros.ros.common.worker_health import rank_report, summary_message, worst_level

CHECK_S = 0.2  # how often Worker states are looked at (cheap: no message to the Workers)
PERIOD_S = 1.0


class ConductorNode(Node):
    def __init__(self, conductor: Conductor, name: str = "conductor", namespace: str = "/mstar") -> None:
        super().__init__(name, namespace=namespace)
        self.conductor = conductor
        self.status_name = f"mstar: {name}"  # as given (a remapped node name does not rename the status)
        self.pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._last_states: tuple = ()
        self._last_publish = 0.0
        self.create_timer(CHECK_S, self._check)

    def _check(self) -> None:
        conductor = self.conductor
        statuses = conductor.worker_status()
        states = tuple((s.rank, s.state, s.pid, s.last_death) for s in statuses)
        if states == self._last_states and time.monotonic() - self._last_publish < PERIOD_S:
            return
        self._last_states, self._last_publish = states, time.monotonic()
        reports = [rank_report(s) for s in statuses]
        stats = conductor.stats()
        values = {
            "graph": conductor.graph.name,
            "in_flight": stats["in_flight"],
            "kv_blocks_used": conductor.kv_blocks_used(),
            "workers_alive": f"{sum(s.up for s in statuses)}/{len(statuses)}",
        }
        for worker, counters in zip(conductor.workers, stats["workers"]):
            for engine, engine_counters in counters.items():
                values.update({f"worker{worker.rank}.{engine}.{k}": v for k, v in engine_counters.items()})
        overall = make_status(
            self.status_name, summary_message(reports, statuses), "mstar", values, worst_level(reports)
        )
        publish_statuses(
            self,
            self.pub,
            [overall, *(make_status(r.name, r.message, r.hardware_id, r.values, r.level) for r in reports)],
        )
