"""Priority classes of requests: control > interactive > batch (a leaf: imports nothing of mstar).

Every request carries one. Engines admit and step the more urgent class first, the one
device thread of a process steps the engine whose due work is most urgent, and the
Conductor may cap how many requests of a class are in flight (docs/scheduling.md).
A lower value is more urgent, so classes sort the way they are served.
"""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    CONTROL = 0  # robot policy chunks, world-model plans: a late answer is a wrong answer
    INTERACTIVE = 1  # voice turns, chat: a person waits
    BATCH = 2  # image generation, offline rollouts: throughput, no deadline

    @classmethod
    def parse(cls, value: str | int | Priority, field: str = "priority") -> Priority:
        """``"control"``, ``"CONTROL"``, ``0`` or ``Priority.CONTROL`` -> Priority.CONTROL; ValueError
        naming ``field`` and the allowed names otherwise."""
        if isinstance(value, Priority):
            return value
        if isinstance(value, str):
            member = cls.__members__.get(value.strip().upper())
            if member is not None:
                return member
        elif isinstance(value, int) and not isinstance(value, bool) and value in cls._value2member_map_:
            return cls(value)
        allowed = ", ".join(name.lower() for name in cls.__members__)
        raise ValueError(f"{field}: {value!r} is not a priority class (one of {allowed})")

    @property
    def label(self) -> str:
        """The name used in config files and logs: ``control``, ``interactive``, ``batch``."""
        return self.name.lower()


# the class every request is treated as when priority classes are off (EngineConfig.priority_classes)
UNCLASSED = Priority.INTERACTIVE
