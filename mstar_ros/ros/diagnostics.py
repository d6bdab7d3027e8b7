"""One /diagnostics message: the status every mstar node publishes (counters as key/value pairs)."""
from __future__ import annotations

from typing import Mapping


def publish_status(node, publisher, name: str, message: str, hardware_id: str,
                   values: Mapping[str, object], level: str = "OK") -> None:
    """Publishes a DiagnosticArray with one status (``level``: OK, WARN or ERROR), stamped now."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    status = DiagnosticStatus(level=getattr(DiagnosticStatus, level), name=name, message=message,
                              hardware_id=hardware_id,
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    array = DiagnosticArray(status=[status])
    array.header.stamp = node.get_clock().now().to_msg()
    publisher.publish(array)
