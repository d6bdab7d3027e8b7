"""Where a control chunk's time went on the device (``bench mixed``): the device thread's step trace
(mstar.engine.step_trace) over each chunk's window, from its submit to its result.

For the median chunk and the slowest 5%, the mean milliseconds the device spent stepping work of each
class inside the window, and of each engine (which front-end), and the rest ("idle": between steps,
or nothing due). A chunk slowed by lower-class steps shows it under "interactive" / "batch"; one
slowed by the other robot's chunk under "control" beyond what a chunk alone takes. With classes off
every engine reports one class (mstar.priority.UNCLASSED), so that run is split by engine only.
"""

from __future__ import annotations

from mstar.engine.step_trace import StepTrace


def _mean_ms(parts: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for p in parts for k in p}, key=lambda k: (k == "idle", k))
    return {k: round(1000 * sum(p.get(k, 0.0) for p in parts) / len(parts), 1) for k in keys}


def chunk_breakdown(spans: list[tuple[float, float]], trace: StepTrace, classes: bool = True) -> dict | None:
    """``{"median": {...}, "slowest_5pct": {...}, "slowest_5pct_chunks": n}``, each ``{"class": {name: ms},
    "engine": {name: ms}}`` over the chunks' windows (``classes=False``: "engine" only); None without
    chunks."""
    if not spans:
        return None
    ordered = sorted(spans, key=lambda s: s[1] - s[0])
    tail = ordered[-max(1, len(ordered) // 20) :]
    splits = ("class", "engine") if classes else ("engine",)

    def where(chosen: list[tuple[float, float]]) -> dict:
        return {by: _mean_ms([trace.overlap(a, b, by) for a, b in chosen]) for by in splits}

    return {
        "median": where([ordered[len(ordered) // 2]]),
        "slowest_5pct": where(tail),
        "slowest_5pct_chunks": len(tail),
    }
