"""BAGEL's own options of an image request (the images API's extension fields, ``mstar-ros bagel``'s
``--cfg-*`` / ``--think`` flags): judged here, each refusal an ``OptionError`` naming its field.

- ``guidance``: ``{text_scale, image_scale, interval, renorm, renorm_min, timestep_shift}``, any subset;
  the rest keep the task's defaults (text-to-image: the reference inferencer's; edit: its app's);
- ``think``: true to plan the image in text first (the thought is returned beside the image).

Values may come as JSON numbers or, from a form, as their text (``"4.0"``, ``"true"``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mstar_graphs.bagel.guidance import RENORM_TYPES, GuidanceParams

OPTIONS = ("guidance", "think")
GUIDANCE_FIELDS = ("text_scale", "image_scale", "interval", "renorm", "renorm_min", "timestep_shift")
EDIT_GUIDANCE = GuidanceParams(image_scale=2.0, interval=(0.0, 1.0), renorm="text_channel")  # the reference app's


class OptionError(ValueError):
    """A refused option; ``param`` names it (``guidance.text_scale``, ``think``, ``steps`` ...)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def default_guidance(edit: bool) -> GuidanceParams:
    return EDIT_GUIDANCE if edit else GuidanceParams()


def parse_image_options(options: Mapping[str, Any] | None, *, edit: bool, steps: int) -> tuple[GuidanceParams, bool]:
    """(the guidance settings with ``steps``, think) from a request's options."""
    options = dict(options or {})
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise OptionError(unknown[0], f"not an option of this model (it takes {', '.join(OPTIONS)})")
    think = _flag("think", options.get("think", False))
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise OptionError("steps", f"must be an integer >= 2, got {steps!r}")
    given = options.get("guidance") or {}
    if not isinstance(given, Mapping):
        raise OptionError("guidance", f"must be an object with {', '.join(GUIDANCE_FIELDS)}, got {given!r}")
    changes: dict[str, Any] = {"steps": steps}
    for name, value in given.items():
        param = f"guidance.{name}"
        if name in ("text_scale", "image_scale", "timestep_shift"):
            changes[name] = _number(param, value, lo=0.0, lo_open=True, note="(<= 1 turns a scale's branch off)")
        elif name == "renorm_min":
            changes[name] = _number(param, value, lo=0.0, hi=1.0)
        elif name == "renorm":
            if value not in RENORM_TYPES:
                raise OptionError(param, f"one of {', '.join(RENORM_TYPES)}, got {value!r}")
            changes[name] = value
        elif name == "interval":
            changes[name] = _interval(param, value)
        else:
            raise OptionError(param, f"not a guidance setting (they are {', '.join(GUIDANCE_FIELDS)})")
    return dataclasses.replace(default_guidance(edit), **changes), think


def _flag(param: str, value: Any) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise OptionError(param, f"must be true or false, got {value!r}")
    return value


def _number(
    param: str, value: Any, *, lo: float, hi: float | None = None, lo_open: bool = False, note: str = ""
) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise OptionError(param, f"must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(param, f"must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
        bounds = f"> {lo:g}" if lo_open else f">= {lo:g}"
        bounds += f" and <= {hi:g}" if hi is not None else ""
        raise OptionError(param, f"must be a finite number {bounds} {note}, got {value!r}".replace("  ", " "))
    return value


def _interval(param: str, value: Any) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or len(value) != 2:
        raise OptionError(param, f"must be [lo, hi] with 0 <= lo <= hi <= 1, got {value!r}")
    lo, hi = (_number(param, v, lo=0.0, hi=1.0) for v in value)
    if lo > hi:
        raise OptionError(param, f"lo {lo:g} is above hi {hi:g}: [lo, hi] with 0 <= lo <= hi <= 1")
    return lo, hi
