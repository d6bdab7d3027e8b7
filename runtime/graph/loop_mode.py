"""Which loop of the AR engine runs a node's calls: one mode field instead of a flag per kind."""

from __future__ import annotations

import enum


class LoopMode(enum.Enum):
    """How an AR node's Loop iterates (``GraphNode.loop_mode``, carried by ``ExecuteNode``).

    TOKEN: sample a token and feed it back (mstar.engine.token_loop); FLOW: Euler steps of a
    continuous state over a forked prefix's KV (mstar.engine.flow_loop); FRAMES: a world
    model's frame context or rollouts over it (mstar.engine.frame_loop); VELOCITY: not a loop
    but one flow evaluation - the velocity ``v`` at the call's state ``x`` and plan step over the
    KV of ``kv_from`` (run by the flow loop), for flows whose steps a Walk drives (classifier-free
    guidance with its views on different Workers).
    """

    TOKEN = "token"
    FLOW = "flow"
    FRAMES = "frames"
    VELOCITY = "velocity"

    @classmethod
    def parse(cls, value: LoopMode | str) -> LoopMode:
        """``value`` as a mode (a declaration may spell it as its string); ValueError names the choices."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown loop mode {value!r}: one of {[m.value for m in cls]}") from None
