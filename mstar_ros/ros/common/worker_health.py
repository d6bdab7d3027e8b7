"""The Conductor's account of its Workers on /diagnostics: one status per rank, and the worst level.

Pure functions of ``mstar.conductor.WorkerStatus`` (no ROS here), so the wording and the
levels are tested without DDS. A rank that is down (restarting or dead) is ERROR, one
still starting WARN, an alive one OK.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mstar.conductor import WorkerStatus

_LEVEL = {"alive": "OK", "starting": "WARN", "restarting": "ERROR", "dead": "ERROR"}
_ORDER = ("OK", "WARN", "ERROR")


@dataclass(frozen=True)
class RankReport:
    name: str
    hardware_id: str
    level: str
    message: str
    values: dict[str, object]


def rank_report(status: WorkerStatus, prefix: str = "mstar: conductor") -> RankReport:
    s = status
    if s.state == "alive":
        message = f"alive (pid {s.pid})"
    elif s.state == "starting":
        message = "starting"
    else:
        message = f"{s.state}: {s.last_death or 'lost'}"
    values = {
        "state": s.state,
        "pid": s.pid if s.pid is not None else "",
        "host": s.host or "",
        "nodes": ",".join(s.nodes),
        "restarts": s.restarts,
        "last_death": s.last_death or "",
        "heartbeat_age_s": f"{s.heartbeat_age_s:.2f}" if s.heartbeat_age_s is not None else "",
        "dtype": s.dtype_reason or s.dtype or "",
    }
    return RankReport(f"{prefix}: worker rank {s.rank}", f"rank{s.rank}", _LEVEL[s.state], message, values)


def worst_level(reports: Sequence[RankReport]) -> str:
    return max((r.level for r in reports), key=_ORDER.index, default="OK")


def summary_message(reports: Sequence[RankReport], statuses: Sequence[WorkerStatus]) -> str:
    """ "serving", or what is wrong with the first rank that is not alive."""
    for report, status in zip(reports, statuses):
        if report.level != "OK":
            return f"worker rank {status.rank} {report.message}"
    return "serving"


def first_down(statuses: Sequence[WorkerStatus]) -> str | None:
    """ "worker rank 1 restarting: died (killed by SIGKILL)" for the first rank that is not alive
    (nothing can be computed on it, so nothing that needs it is), or None when all are."""
    for status in statuses:
        if not status.up:
            return f"worker rank {status.rank} {rank_report(status).message}"
    return None
