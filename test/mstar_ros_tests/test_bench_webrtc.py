"""``mstar-ros bench webrtc --quick``: peers in their own process, the gateway's figures paired per response.

Timings on a shared 2-core machine are reported, not bounded here (the benchmark states whether the goals were
met); what could be wrong in any case is asserted: every response heard, the decomposition adds up, files."""

import json
import subprocess
import sys

import pytest

from support.bench_reports import assert_machine_and_dtypes


@pytest.mark.slow
def test_bench_webrtc_quick(tmp_path):
    out, png = tmp_path / "w.json", tmp_path / "w.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "bench",
            "webrtc",
            "--quick",
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
    assert sorted(report["levels"], key=int) == ["1", "2"]
    for n, level in report["levels"].items():
        assert level["responses"] == int(n)  # --quick: one round
        peer, model = level["ttfa_peer_ms"]["p50"], level["ttfa_in_process_ms"]["p50"]
        assert 0 < model < peer  # the peer hears it after the Conductor made it
        assert level["ttfa_overhead_ms"]["max"] > 0 and level["whole_file_ms"]["p50"] > 0
        assert level["whole_file_with_peers_ms"]["p50"] > 0  # timed with the peers still connected, idle
        assert level["ttfa_ratio_stream_vs_file"] == round(peer / level["whole_file_with_peers_ms"]["p50"], 4)
        assert level["audio_s_per_response"] > 0 and level["jitter_ms_max"] >= 0
        assert 0 <= level["responses_below_rtf_1"] <= level["responses"]
        assert 0 <= level["underruns_in_responses_below_rtf_1"] <= level["underruns"]
    assert report["ttfa_overhead_p95_ms_2_peers"] == report["levels"]["2"]["ttfa_overhead_ms"]["p95"]
    assert report["model"]["random_weights"] is True
    assert png.stat().st_size > 10_000
    assert "gateway overhead p95 at 2 peers" in run.stdout
    assert report["responses_below_rtf_1"] == sum(lv["responses_below_rtf_1"] for lv in report["levels"].values())
    assert "responses made at RTF < 1" in run.stdout
    assert_machine_and_dtypes(report, baseline=False)
    assert report["options"]["dtype"] == report["dtypes"]["ours"]["dtype"]
