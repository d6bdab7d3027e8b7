"""The order an engine serves its calls in: by priority class, then by arrival.

One rule for every loop (token, flow, frame) and the stateless engine, so that
``EngineConfig.priority_classes = False`` puts every call in one class and restores
plain first-come first-served order everywhere at once.
"""

from __future__ import annotations

from mstar.engine.messages import ExecuteNode
from mstar.priority import UNCLASSED, Priority


def call_class(msg: ExecuteNode | None, classes_on: bool) -> Priority:
    """The class a call is served as: its request's, or one class for all when classes are off."""
    if not classes_on or msg is None:
        return UNCLASSED
    return Priority(msg.priority)


def serve_key(msg: ExecuteNode | None, arrival: float, classes_on: bool) -> tuple[int, float]:
    """Sort key: more urgent class first, then older first."""
    return (int(call_class(msg, classes_on)), arrival)
