"""How the Conductor's node words and grades each Worker rank on /diagnostics (no ROS needed)."""

from __future__ import annotations

from mstar.conductor import WorkerStatus
from mstar_ros.ros.common.worker_health import first_down, rank_report, summary_message, worst_level


def status(rank: int, state: str, **kw) -> WorkerStatus:
    base = dict(
        pid=100 + rank,
        host="h",
        nodes=("vision",),
        restarts=0,
        last_death=None,
        heartbeat_age_s=0.25 if state == "alive" else None,
    )
    return WorkerStatus(rank=rank, state=state, **{**base, **kw})


def test_each_rank_is_graded_by_its_state_and_says_why_it_is_down():
    ranks = [
        status(0, "alive", dtype="bfloat16", dtype_reason="bfloat16 (auto: native bf16 (avx512_bf16))"),
        status(1, "restarting", restarts=2, last_death="died (killed by SIGKILL)"),
        status(2, "starting"),
        status(3, "dead", last_death="the process exited with status 1 during setup"),
    ]
    reports = [rank_report(s) for s in ranks]
    assert [r.level for r in reports] == ["OK", "ERROR", "WARN", "ERROR"]
    assert [r.message for r in reports] == [
        "alive (pid 100)",
        "restarting: died (killed by SIGKILL)",
        "starting",
        "dead: the process exited with status 1 during setup",
    ]
    assert reports[1].name == "mstar: conductor: worker rank 1" and reports[1].hardware_id == "rank1"
    assert reports[0].values == {
        "state": "alive",
        "pid": 100,
        "host": "h",
        "nodes": "vision",
        "restarts": 0,
        "last_death": "",
        "heartbeat_age_s": "0.25",
        "dtype": "bfloat16 (auto: native bf16 (avx512_bf16))",
    }  # what it runs, and why
    assert reports[1].values["restarts"] == 2 and reports[1].values["heartbeat_age_s"] == ""
    assert reports[1].values["dtype"] == ""  # not said yet
    assert worst_level(reports) == "ERROR" and worst_level(reports[:1]) == "OK" and worst_level(reports[:3:2]) == "WARN"
    assert summary_message(reports, ranks) == "worker rank 1 restarting: died (killed by SIGKILL)"
    assert summary_message(reports[:1], ranks[:1]) == "serving"


def test_the_first_rank_down_is_named_with_why():
    ranks = [status(0, "alive"), status(1, "restarting", last_death="died (killed by SIGKILL)"), status(2, "starting")]
    assert first_down(ranks) == "worker rank 1 restarting: died (killed by SIGKILL)"
    assert first_down(ranks[2:]) == "worker rank 2 starting"
    assert first_down(ranks[:1]) is None
