"""A node's sensor subscriptions by topic, any of which can be shut for a while: a flood of bad messages.

mstar_ros.policy.flood_guard decides when a topic floods and for how long to hold it; this does the
ROS part: the subscription is destroyed (the publisher's data then goes nowhere, costing this
process nothing) and made again by a one-shot timer when the hold is over, unless the node is
closing by then. Everything runs on the executor's thread, as the callbacks that call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SensorSubscriptions:
    def __init__(
        self,
        node: Any,
        make: dict[str, Callable[[], Any]],
        on_reopen: Callable[[str], None],
        closing: Callable[[], bool],
    ) -> None:
        """``make``: topic -> a function that subscribes to it (and returns the subscription); ``on_reopen(topic)``
        is called when a held topic is listened to again; ``closing()``: the node is going, reopen nothing."""
        self._node, self._make, self._on_reopen, self._closing = node, make, on_reopen, closing
        self._live = {topic: subscribe() for topic, subscribe in make.items()}

    def is_open(self, topic: str) -> bool:
        return topic in self._live

    def hold(self, topic: str, seconds: float) -> bool:
        """Unsubscribes ``topic`` for ``seconds``; False when it was not open (already held)."""
        subscription = self._live.pop(topic, None)
        if subscription is None:
            return False
        self._node.destroy_subscription(subscription)
        timers = []

        def reopen() -> None:
            self._node.destroy_timer(timers[0])  # one shot
            if self._closing() or topic in self._live:
                return
            self._live[topic] = self._make[topic]()
            self._on_reopen(topic)

        timers.append(self._node.create_timer(seconds, reopen))
        return True
