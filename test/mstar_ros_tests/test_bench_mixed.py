"""``mstar-ros bench mixed --quick`` runs end to end (tiny models, short phases: figures are not judged) and
mstar_ros.bench.mixed's summary arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mstar_ros.bench.mixed import summarize


@pytest.mark.slow
def test_bench_mixed_quick_writes_json_and_plot(tmp_path):
    out_json, out_png = tmp_path / "m.json", tmp_path / "m.png"
    run = subprocess.run(
        [sys.executable, "-m", "mstar_ros.cli", "-q", "bench", "mixed", "--quick"]
        + ["--json", str(out_json), "--plot", str(out_png)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert out_png.stat().st_size > 1000
    assert report["alone"]["chunks"] > 0 and report["loaded"]["chunks"] > 0
    assert report["loaded"]["images"] >= 1 and report["loaded"]["voice"]["answers"] >= 1
    assert report["control_p95_ratio"] == round(report["loaded"]["p95_ms"] / report["alone"]["p95_ms"], 3)
    assert report["classes_off"]["chunks"] > 0 and "control_p95_ratio" in report["classes_off"]
    assert report["one_process"]["chunks"] > 0 and report["one_process"]["images"] >= 1
    assert "control_p95_ratio" in run.stdout and "classes off" in run.stdout and "idle process" in run.stdout
    # the voice engine as config/edge.yaml serves it: config/engine_voice.yaml's compile: auto, compiled
    # where inductor can run (make test installs g++)
    import torch

    from mstar.engine.compile_support import compile_blocker

    assert report["voice_engine"]["compile"] == "auto"
    assert report["voice_engine"]["forward_compiled"] is (compile_blocker(torch.device("cpu"), 1, "none") is None)
    # where the chunks' time went: the steps traced inside their windows, by class and by engine
    where = report["one_process"]["chunk_device_ms"]["median"]
    assert where["class"]["control"] > 0 and any(name.startswith("ar:") for name in where["engine"])


def test_late_chunks_are_those_past_the_refill_point_and_each_loaded_run_is_measured():
    on = {
        "alone": {"control": [0.1] * 20, "voice_rtf": [0.5, 0.6], "where": None},
        "loaded": {"control": [0.1] * 18 + [0.2, 2.0], "voice_rtf": [0.9], "image_s": [3.0], "where": None},
    }
    one = {"loaded": {"control": [0.2] * 20, "voice_rtf": [1.1], "image_s": [2.0, 2.0], "where": None}}
    off = {"loaded": {"control": [0.3] * 20, "voice_rtf": [], "image_s": [], "where": None}}
    out = summarize(on, one, off, deadline_s=1.0)
    assert out["late_chunk_share"] == 0.05 and out["loaded"]["p95_ms"] == 290.0  # interpolated: 0.2 + 0.05 * 1.8
    assert out["control_p95_ratio"] == 2.9 and out["voice_rtf_loaded_p95"] == 0.9
    assert out["one_process"]["control_p95_ratio"] == 2.0 and out["one_process"]["images"] == 2
    assert out["classes_off"]["control_p95_ratio"] == 3.0 and out["classes_off"]["voice"]["answers"] == 0
