"""tools/gpu_check.py through the CPU paths: the script a GPU session runs stays runnable."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_check  # noqa: E402


def test_every_check_passes_on_cpu(tmp_path):
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--device", "cpu", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["attention"]["backend"] == "torch" and report["attention"]["max_error"] < 1e-5
    assert len(report["attention"]["cases"]) == 2 * len(gpu_check.ATTENTION_CASES)
    assert all(r["identical_prefix"] == r["tokens"] == r["reference_tokens"] > 0 for r in report["orpheus"]["requests"])
    assert report["pi05"]["max_abs_error"] < 1e-4  # served on the runtime == dense direct reference


def test_on_cuda_only_flashinfer_within_tolerance_passes():
    assert gpu_check.attention_ok("cpu", "torch", 1e-6, 1e-5)
    assert gpu_check.attention_ok("cuda", "flashinfer", 1e-2, 2e-2)
    assert not gpu_check.attention_ok("cuda:0", "torch", 1e-6, 2e-2)  # fell back: the GPU path never ran
    assert not gpu_check.attention_ok("cuda", "flashinfer", 3e-2, 2e-2)
