"""The pi0.5 node set under a placement, over real DDS with real Worker processes: what it says of them.

A Worker killed with SIGKILL shows on /diagnostics by rank (ERROR while it is down, OK once
its replacement serves), and a Worker that cannot set up ends the node set as a bad
checkpoint does without a placement: one line, status 2, no traceback.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mstar_graphs.pi05.checkpoints import resolve_path
from mstar_ros.launch_spec import pi05_processes

PLACEMENT = Path(__file__).parents[3] / "config" / "placement" / "pi05-two-ranks.yaml"
RANK = "mstar: conductor: worker rank {}"


def statuses(ros_client, name: str) -> list:
    return [s for g in ros_client.got("/diagnostics") for s in g.msg.status if s.name == name]


def values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_killed_worker_shows_error_then_ok_by_rank_on_diagnostics(procs, ros_client):
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=1000)
    (spec,) = pi05_processes("/robot1", placement=str(PLACEMENT), extra_arguments=["--duration", "150"])
    node_set = procs(*spec.command(python=sys.executable))
    ros_client.wait_for(
        lambda: all(any(s.level == DiagnosticStatus.OK for s in statuses(ros_client, RANK.format(r))) for r in (0, 1)),
        120,
        "both ranks OK on /diagnostics",
        [node_set],
    )
    before = values(statuses(ros_client, RANK.format(1))[-1])
    assert before["state"] == "alive" and before["restarts"] == "0" and before["last_death"] == ""
    assert before["nodes"] == "vision" and 0.0 <= float(before["heartbeat_age_s"]) < 5.0
    seen = len(ros_client.got("/diagnostics"))
    os.kill(int(before["pid"]), signal.SIGKILL)

    def after_kill(name: str) -> list:
        return [s for g in ros_client.got("/diagnostics")[seen:] for s in g.msg.status if s.name == name]

    ros_client.wait_for(
        lambda: any(s.level == DiagnosticStatus.ERROR for s in after_kill(RANK.format(1))),
        30,
        "rank 1 reported ERROR",
        [node_set],
    )
    down = [s for s in after_kill(RANK.format(1)) if s.level == DiagnosticStatus.ERROR]
    assert all(s.hardware_id == "rank1" and values(s)["state"] == "restarting" for s in down), down
    # the exit status is known a few ms after the connection drops: the reason follows at once
    ros_client.wait_for(
        lambda: any(s.message == "restarting: died (killed by SIGKILL)" for s in after_kill(RANK.format(1))),
        10,
        "the reason of rank 1's death",
        [node_set],
    )
    assert any(
        s.level == DiagnosticStatus.ERROR and s.message == "worker rank 1 restarting: died (killed by SIGKILL)"
        for s in after_kill("mstar: conductor")
    ), "the Conductor's own status did not turn ERROR"

    ros_client.wait_for(
        lambda: any(s.level == DiagnosticStatus.OK for s in after_kill(RANK.format(1))),
        90,
        "rank 1 OK again",
        [node_set],
    )
    back = values(next(s for s in after_kill(RANK.format(1)) if s.level == DiagnosticStatus.OK))
    assert back["state"] == "alive" and back["restarts"] == "1" and back["pid"] != before["pid"]
    assert back["last_death"] == "died (killed by SIGKILL)"
    ros_client.wait_for(
        lambda: after_kill("mstar: conductor")[-1].level == DiagnosticStatus.OK,
        10,
        "the Conductor's status OK again",
        [node_set],
    )
    # rank 0 was never down
    assert all(s.level == DiagnosticStatus.OK for s in statuses(ros_client, RANK.format(0)))
    assert node_set.interrupt() == 0, node_set.output


def corrupt_checkpoint(tmp_path: Path) -> Path:
    """The generated tiny checkpoint with its weights cut in half: config and statistics read, the weights do not."""
    bad = tmp_path / "corrupt"
    shutil.copytree(resolve_path(None, "tiny"), bad)
    weights = max(bad.glob("*.safetensors"), key=lambda p: p.stat().st_size)  # the model's, not a normaliser's
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return bad


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_worker_that_fails_setup_ends_the_node_set_as_without_a_placement(ros_env, tmp_path):
    bad = corrupt_checkpoint(tmp_path)
    runs = {}
    for placement in (None, str(PLACEMENT)):
        (spec,) = pi05_processes("/robot1", weights=str(bad), placement=placement, extra_arguments=["--duration", "30"])
        runs[placement] = subprocess.run(
            spec.command(python=sys.executable), env=ros_env, capture_output=True, text=True, timeout=200
        )
    errors = {}
    for placement, run in runs.items():
        output = run.stdout + run.stderr
        assert run.returncode == 2, output
        assert "Traceback" not in output, output
        lines = [line for line in output.splitlines() if "error" in line.lower()]
        assert len(lines) == 1 and lines[0].startswith("mstar_pi05_node_set: error: WeightsError: "), output
        errors[placement] = lines[0]
    alone = errors[None]
    assert "cannot read safetensors file" in alone and str(bad) in alone
    assert errors[str(PLACEMENT)] in (f"{alone} (worker rank 0)", f"{alone} (worker rank 1)"), errors
