"""``mstar-ros bench transport`` end to end on tiny sizes: the report has every table and headline."""
from __future__ import annotations

import importlib.util
import json

from mstar_ros.cli import main


def test_bench_transport_writes_report_and_plot(tmp_path):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    rc = main(["-q", "bench", "transport", "--json", str(out), "--plot", str(png), "--sizes", "4K,64K",
               "--repeats", "3", "--transports", "shm,tcp,inline,mooncake",
               "--orpheus-requests", "2", "--orpheus-preset", "tiny"])
    assert rc == 0
    report = json.loads(out.read_text())
    split = report["orpheus_split"]
    for side in ("single_process", "two_processes"):
        assert split[side]["requests"] == 2 and split[side]["throughput_audio_s_per_s"] > 0
    assert split["two_vs_single_throughput"] > 0
    section = report["transport"]
    assert section["sizes"] == [4096, 65536]
    measured = {"shm", "tcp", "inline", "mooncake"}
    if importlib.util.find_spec("mooncake") is None:  # the bench says so instead of failing
        assert "not installed" in section["skipped"]["mooncake"]
        measured.discard("mooncake")
    assert set(section["transports"]) == measured
    for kind, table in section["transports"].items():
        for size in ("4096", "65536"):
            row = table[size]
            assert row["latency_us_p50"] > 0 and row["bandwidth_gbps"] > 0, (kind, size)
            assert row["vs_memcpy"] == row["bandwidth_gbps"] / section["memcpy"][size]["bandwidth_gbps"]
    assert section["shm_latency_4kb_us"] == section["transports"]["shm"]["4096"]["latency_us_p50"]
    assert section["shm_vs_memcpy_64mb"] is None  # 64MB was not among the sizes
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 1000
