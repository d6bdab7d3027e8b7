"""The Conductor as a ROS 2 node: its runtime state on /diagnostics once a second."""
from __future__ import annotations


def conductor_node(conductor, name: str = "conductor", namespace: str = "/mstar"):
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rclpy.node import Node

    class ConductorNode(Node):
        def __init__(self) -> None:
            super().__init__(name, namespace=namespace)
            self.pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
            self.create_timer(1.0, self._publish)

        def _publish(self) -> None:
            stats = conductor.stats()
            values = [KeyValue(key="graph", value=conductor.graph.name),
                      KeyValue(key="in_flight", value=str(stats["in_flight"])),
                      KeyValue(key="kv_blocks_used", value=str(conductor.kv_blocks_used()))]
            for i, worker in enumerate(stats["workers"]):
                for engine, counters in worker.items():
                    values += [KeyValue(key=f"worker{i}.{engine}.{k}", value=str(v)) for k, v in counters.items()]
            status = DiagnosticStatus(level=DiagnosticStatus.OK, name=f"mstar: {name}",
                                      message="serving", hardware_id="mstar", values=values)
            array = DiagnosticArray(status=[status])
            array.header.stamp = self.get_clock().now().to_msg()
            self.pub.publish(array)

    return ConductorNode()
