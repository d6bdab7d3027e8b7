"""tools/dtype_compare.py: the rows it takes from each bench's report and the table it writes.

(The benches themselves run end to end in test/mstar_ros_tests/test_bench*.py; a whole comparison
takes half an hour, so here its reading of their reports is checked on reports of their shape.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("dtype_compare", Path(__file__).parents[2] / "tools" / "dtype_compare.py")
dtype_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dtype_compare)

MACHINE = {
    "cpu": "AMD EPYC",
    "cpu_capability": "AVX2",
    "bf16_instructions": ["avx512_bf16"],
    "threads": 2,
    "torch": "2.13.0+cpu",
    "isa_limits": {"ATEN_CPU_CAPABILITY": "avx2"},
}


def dtypes(ran: str, baseline: str) -> dict:
    return {"ours": {"dtype": ran, "requested": "auto", "reason": "r"}, "baseline": {"dtype": baseline, "why": "w"}}


def omni(ran: str) -> dict:
    def level(ttfa, tp, ratio):
        return {
            "ours": {"ttfa_ms": {"p50": ttfa}, "throughput_audio_s_per_s": tp},  # noqa: E731
            "throughput_ratio": ratio,
        }

    return {
        "machine": MACHINE,
        "dtypes": dtypes(ran, "float32"),
        "_wall_s": 60.0,
        "levels": {"1": level(1500, 1.5, 1.1), "8": level(3400, 6.1, 6.0)},
    }


def orpheus(ran: str) -> dict:
    def level(tp, tok, ttfa, ratio):
        return {
            "ours": {
                "throughput_audio_s_per_s": tp,
                "audio_tokens_per_s": tok,  # noqa: E731
                "ttfa_p50_ms": ttfa,
            },
            "throughput_ratio": ratio,
        }

    return {
        "machine": MACHINE,
        "dtypes": dtypes(ran, "bfloat16"),
        "_wall_s": 90.0,
        "levels": {"1": level(1.5, 90.0, 300, 2.5), "8": level(5.5, 177.7, 150, 4.75)},
    }


def pi05(ran: str) -> dict:
    level = lambda cps, ratio: {"ours": {"closed_loop": {"chunks_per_s": cps}}, "throughput_ratio": ratio}  # noqa: E731
    return {
        "machine": MACHINE,
        "dtypes": dtypes(ran, ran),
        "_wall_s": 70.0,
        "batching_bound": {"direct_forward_ms": 250},
        "levels": {"1": level(3.3, 0.95), "4": level(4.3, 1.2)},
    }


def test_rows_take_the_figures_that_decide_a_dtype():
    assert dtype_compare.row("qwen3-omni", "auto", omni("float32")) == {
        "bench": "qwen3-omni",
        "dtype": "auto",
        "ran": "float32",
        "wall_s": 60.0,
        "ttfa_p50_ms_c1": 1500,
        "audio_s_per_s_c1": 1.5,
        "ttfa_p50_ms_c8": 3400,
        "audio_s_per_s_c8": 6.1,
        "ratio_vs_transformers_c8": 6.0,
        "baseline_dtype": "float32",
    }
    r = dtype_compare.row("orpheus", "bfloat16", orpheus("bfloat16"))
    assert (r["ran"], r["tokens_per_s_c8"], r["ratio_vs_transformers_c8"], r["baseline_dtype"]) == (
        "bfloat16",
        177.7,
        4.75,
        "bfloat16",
    )
    r = dtype_compare.row("pi05", "float32", pi05("float32"))
    assert (r["chunks_per_s_4_robots"], r["direct_forward_ms"], r["ratio_vs_direct_4_robots"]) == (4.3, 250, 1.2)


def test_the_table_names_the_machine_and_has_a_line_per_dtype():
    rows = [
        dtype_compare.row(b, d, make(ran))
        for b, make in (("qwen3-omni", omni), ("pi05", pi05))
        for d, ran in (("auto", "float32"), ("bfloat16", "bfloat16"), ("float32", "float32"))
    ]
    table = dtype_compare.markdown(MACHINE, rows)
    assert table.splitlines()[0] == (
        "Machine: AMD EPYC, ATen dispatch AVX2, bf16 instructions: avx512_bf16, "
        "ATEN_CPU_CAPABILITY=avx2, 2 threads, torch 2.13.0+cpu"
    )
    assert "`bench qwen3-omni`" in table and "`bench pi05`" in table and "`bench orpheus`" not in table
    assert "| auto | float32 | 60.0 | 1500 |" in table and "| bfloat16 | bfloat16 | 70.0 | 3.3 | 4.3 | 250 |" in table


def test_unknown_benches_are_refused():
    with pytest.raises(SystemExit):
        dtype_compare.main(["--benches", "bagel"])
