"""/diagnostics messages: the statuses every mstar node publishes (counters as key/value pairs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def make_status(name: str, message: str, hardware_id: str, values: Mapping[str, object], level: str = "OK"):
    """A DiagnosticStatus (``level``: OK, WARN or ERROR)."""
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

    return DiagnosticStatus(
        level=getattr(DiagnosticStatus, level),
        name=name,
        message=message,
        hardware_id=hardware_id,
        values=[KeyValue(key=k, value=str(v)) for k, v in values.items()],
    )


def publish_statuses(node, publisher, statuses: Sequence) -> None:
    """Publishes one DiagnosticArray holding ``statuses``, stamped now."""
    from diagnostic_msgs.msg import DiagnosticArray

    array = DiagnosticArray(status=list(statuses))
    array.header.stamp = node.get_clock().now().to_msg()
    publisher.publish(array)


def publish_status(
    node, publisher, name: str, message: str, hardware_id: str, values: Mapping[str, object], level: str = "OK"
) -> None:
    """Publishes a DiagnosticArray with one status, stamped now."""
    publish_statuses(node, publisher, [make_status(name, message, hardware_id, values, level)])
