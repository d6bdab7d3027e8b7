"""The Conductor as a ROS 2 node: its runtime state on /diagnostics once a second."""
from __future__ import annotations


def conductor_node(conductor, name: str = "conductor", namespace: str = "/mstar"):
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.node import Node

    from mstar_ros.ros.diagnostics import publish_status

    class ConductorNode(Node):
        def __init__(self) -> None:
            super().__init__(name, namespace=namespace)
            self.pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.create_timer(1.0, self._publish)

        def _publish(self) -> None:
            stats = conductor.stats()
            values = {"graph": conductor.graph.name, "in_flight": stats["in_flight"],
                      "kv_blocks_used": conductor.kv_blocks_used()}
            for i, worker in enumerate(stats["workers"]):
                for engine, counters in worker.items():
                    values.update({f"worker{i}.{engine}.{k}": v for k, v in counters.items()})
            publish_status(self, self.pub, f"mstar: {name}", "serving", "mstar", values)

    return ConductorNode()
