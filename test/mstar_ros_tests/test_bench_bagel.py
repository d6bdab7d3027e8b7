"""``mstar-ros bench bagel --quick``: both systems on the tiny checkpoint, the ratios and the bound computed.

Timings on a shared 2-core machine are reported, not bounded here (the benchmark states whether the goals
were met); what could be wrong in any case is asserted: the baseline computes what the served path does
(same latents, same tokens, in float32), the ratios are formed from the figures, the files are written."""

import json
import subprocess
import sys

import pytest

from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.guidance import GuidanceParams
from mstar_ros.bench.bagel import BagelBenchOptions, check_options
from mstar_ros.bench.bagel_bound import bound, schedule_counts
from mstar_ros.bench.bagel_chat import throughput_bound
from support.bench_reports import assert_machine_and_dtypes


def test_bound_weighs_guided_and_unguided_steps():
    assert bound(4, 0, one=1.0, separate=3.0, together=2.0) == 1.5
    assert bound(1, 1, one=1.0, separate=3.0, together=1.0) == 2.0  # an unguided step is one forward in both
    t2i = GenerationParams(GuidanceParams(steps=8), 2, 2).pack()  # interval (0.4, 1]: the last evaluation unguided
    edit = GenerationParams(GuidanceParams(steps=8, interval=(0.0, 1.0)), 2, 2).pack()
    assert schedule_counts(t2i) == (6, 1) and schedule_counts(edit) == (7, 0)


def test_throughput_bound_counts_prefills_once_per_request():
    # 8 requests, prefill 1 s each in both systems; 10 tokens at 0.1 s alone or 0.2 s per step of all 8
    assert throughput_bound(8, 1.0, 0.1, 0.2, 10) == pytest.approx(8 * 2.0 / (8 + 2.0))
    assert throughput_bound(1, 1.0, 0.1, 0.1, 10) == 1.0


def test_answers_default_to_the_reference_apps_length():
    assert BagelBenchOptions().answer_tokens == 512  # app.py's max_new_tokens for understanding


def test_options_that_cannot_run_are_named():
    with pytest.raises(ValueError, match="--steps must be >= 3"):
        check_options(BagelBenchOptions(steps=2))
    with pytest.raises(ValueError, match="--concurrency"):
        check_options(BagelBenchOptions(concurrency=[]))


def test_bench_bagel_quick(tmp_path):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    run = subprocess.run(
        [sys.executable, "-m", "mstar_ros.cli", "-q", "bench", "bagel", "--quick", "--dtype", "float32"]
        + ["--json", str(out), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    r = json.loads(out.read_text())
    for task in ("edit", "t2i"):
        row = r[task]
        assert row["latent_rel_diff"] < 1e-4  # the baseline's algorithm computes the served path's latents
        assert row["speedup"] == pytest.approx(row["reference_s"] / row["ours_s"])
        assert row["fraction_of_bound"] == pytest.approx(row["speedup"] / r["bound"][task]["bound"])
        assert r[f"speedup_{task}"] == row["speedup"]
    assert r["edit"]["reference_flow_forwards"] == 2 * 3  # two evaluations, three contexts one by one
    assert r["bound"]["edit"]["branches_together"] == 3 and r["bound"]["t2i"]["branches_together"] == 2
    rows = r["bound"]["edit"]["context_rows"]  # full = [VAE span, ViT span, turn]; no text = the spans
    assert rows["gen"] == r["model"]["edit_context_rows"] and rows["gen"] - rows["cfg_text"] == rows["cfg_img"]
    assert r["bound"]["t2i"]["context_rows"]["cfg_text"] == 0 and r["model"]["vit"]["layers"] == 2
    assert [g["rows"] for g in r["bound"]["gemm"]] == [1, 8, 18, 54]  # 16 latent tokens + 2 markers
    chat = r["chat"]
    answered, total = chat["first_answer_tokens_equal"].split("/")
    assert answered == total  # greedy answers agree token for token
    assert int(total) == chat["answer_tokens"] == 4  # random weights: neither system stops early
    assert sorted(chat["levels"], key=int) == ["1", "2"]
    level = chat["levels"]["2"]
    assert r["throughput_ratio_c2"] == pytest.approx(level["tokens_per_s"] / level["reference"]["tokens_per_s"])
    assert level["decode_step_ms"] > 0 and level["throughput_bound"] > 0 and r["max_batched_tokens"] == 1024
    assert r["ttft_ratio_c1"] > 0 and r["ttft_ratio_c1_as_served"] < r["ttft_ratio_c1"] * 1.0001
    assert set(r["goals_met"]) >= {"speedup_edit", "speedup_t2i", "ttft_ratio_c1", "throughput_ratio_c2"}
    assert r["model"]["random_weights"] is True and "RANDOM weights" in run.stdout
    assert png.stat().st_size > 10_000
    assert_machine_and_dtypes(report=r, requested="float32")
