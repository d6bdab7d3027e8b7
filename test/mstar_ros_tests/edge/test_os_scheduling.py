"""A process group's CPU scheduling (mstar_ros.edge.os_scheduling), set in a process of its own: the policy
the kernel reports for its threads, those started afterwards included."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mstar_ros.edge.os_scheduling import apply_scheduling

PROBE = """
import os, sys, threading
from mstar_ros.edge.os_scheduling import apply_scheduling, current_scheduling
apply_scheduling(sys.argv[1])
seen = []
t = threading.Thread(target=lambda: seen.append(current_scheduling()))
t.start(); t.join()
print(current_scheduling(), seen[0], os.sched_getscheduler(0) == getattr(os, "SCHED_" + sys.argv[2]))
"""


@pytest.mark.parametrize("policy, kernel", [("idle", "IDLE"), ("normal", "OTHER")])
def test_the_process_and_the_threads_it_starts_run_under_the_policy(policy, kernel):
    out = subprocess.run([sys.executable, "-c", PROBE, policy, kernel], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [policy, policy, "True"]


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="scheduling must be one of normal, idle, got 'fifo'"):
        apply_scheduling("fifo")


def test_a_normal_group_started_under_idle_is_put_back_on_the_default_policy():
    code = (
        "from mstar_ros.edge.os_scheduling import apply_scheduling, current_scheduling\n"
        "apply_scheduling('idle'); print(current_scheduling())\n"
        "apply_scheduling('normal'); print(current_scheduling())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["idle", "normal"]  # as root (the tests run as root): CAP_SYS_NICE
