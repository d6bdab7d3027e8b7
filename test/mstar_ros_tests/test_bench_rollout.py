"""``mstar-ros bench rollout --quick``: both systems from a bag, same outputs, the bound and the figures written.

Timings on a shared 2-core machine are reported, not bounded here (the benchmark itself states whether
the goals were met); what could be wrong in any case is asserted: equal outputs, the bound formula, files."""

import json
import subprocess
import sys

from mstar_ros.bag.end_effector import EndEffectorBagSpec, write_end_effector_bag
from mstar_ros.bench.rollout import extend_request, plan_request, rollout_request, token_bound


def test_every_request_of_the_benchmark_is_batch():
    import torch

    from mstar.priority import Priority
    from mstar_graphs.vjepa2.planner import CemParams, initial_belief

    params = CemParams(samples=4, topk=2, iterations=1)
    mean, std = initial_belief(2, params)
    requests = [
        extend_request(torch.zeros(2, 3, 4), torch.zeros(2, 7), torch.zeros(1, 7), "s"),
        rollout_request(torch.zeros(1, 2, 7), "s"),
        plan_request(torch.zeros(3, 4), mean, std, params, "s", seed=1),
    ]
    assert [r.priority for r in requests] == [Priority.BATCH] * 3
    assert requests[0].meta == {"walk": "extend"} and requests[2].outputs == frozenset({"plan"})


def test_token_bound():
    assert token_bound(0, 4) == 2.5 and token_bound(1, 4) == 3.5 and token_bound(1, 30) == 16.5


def test_bench_rollout_quick_from_a_bag(tmp_path):
    bag = tmp_path / "wm"
    write_end_effector_bag(bag, EndEffectorBagSpec(robots=2, seconds=3.0, width=32, height=32))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "rollout",
            "--quick",
            "--bag",
            str(bag),
            "--dtype",
            "float32",  # parity of the two systems' outputs below: float32
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [r["horizon"] for r in report["rollouts"]] == [2, 4]
    for r in report["rollouts"]:
        assert r["max_abs_diff"] < 1e-4  # ours and the native recompute predict the same frame
        assert r["token_bound"] == token_bound(1, r["horizon"]) and r["ours_ms"] > 0 and r["native_ms"] > 0
        assert report[f"speedup_h{r['horizon']}"] == r["speedup"]
    assert [p["sessions"] for p in report["plans"]] == [1, 2]
    assert all(p["max_plan_diff"] < 1e-4 for p in report["plans"])  # our plans equal Meta's planner's
    assert report["robots_in_bag"] == 2 and report["model"]["random_weights"] is True
    assert png.stat().st_size > 10_000
    assert report["dtypes"]["ours"] == {"dtype": "float32", "requested": "float32", "reason": "set explicitly"}
    assert report["dtypes"]["baseline"]["dtype"] == "float32"
    assert report["machine"]["cpu_capability"] and report["machine"]["threads"] >= 1
    assert "speedup" in run.stdout and "ms per action" in run.stdout
