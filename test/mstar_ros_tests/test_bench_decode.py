"""``mstar-ros bench decode --quick``: both systems decode the tiny preset, the figures and plot are written.

Timings on a shared 2-core machine are reported, not bounded here; what is asserted could be wrong in
any case: every system ran (or says why not), the streams agree, the ratios are the figures' ratios."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mstar_graphs.orpheus.tiny_llm import config_dict
from mstar_ros.bench.decode import OURS, head_share, prompts


def test_decode_preset_keeps_the_3b_head_share():
    real_3b = {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 156940,
        "tie_word_embeddings": True,
    }
    assert 3200 < head_share(real_3b)["params_m"] < 3400 and 0.14 < head_share(real_3b)["lm_head_share"] < 0.15
    share = head_share(config_dict("decode"))
    assert 0.14 < share["lm_head_share"] < 0.16 and 700 < share["params_m"] < 900
    assert head_share(config_dict("bench"))["lm_head_share"] > 0.7  # why the bench preset would not do


def test_prompts_are_deterministic_and_start_with_bos():
    a, b = prompts(3, 8, 5), prompts(3, 8, 5)
    assert a == b and len(a) == 3 and all(len(p) == 8 and p[0] == 128000 for p in a) and a[0] != a[1]


@pytest.mark.slow
def test_bench_decode_quick(tmp_path):
    out, png = tmp_path / "d.json", tmp_path / "d.png"
    run = subprocess.run(
        [sys.executable, "-m", "mstar_ros.cli", "-q", "bench", "decode", "--quick", "--levels", "1,3"]
        + ["--no-step-overhead", "--json", str(out), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert list(report["levels"]) == ["1", "3"] and report["model"]["random_weights"] is True
    quantized = ["ours_fp16", "ours_int8", "ours_int8_dynamic", "ours_int4"]
    assert report["int8_vs_q8_c1"] is not None and report["openmp_teams_released"] is True
    assert report["int8_dynamic_vs_q8_c1"] is not None and report["fp16_vs_f16_c1"] is not None
    for level in report["levels"].values():
        ran = [k for k in ("ours_bf16", *quantized, "llama_f16", "llama_q8_0", "llama_q4_k_m") if k in level]
        assert len(ran) == 8
        assert all(level[k]["tokens_per_s"] > 0 and len(level[k]["runs_tokens_per_s"]) == 1 for k in ran)
        assert level["agreement_ours_bf16_vs_llama_f16"]["of"] == 16
        assert level["agreement_ours_bf16_vs_llama_f16"]["first_divergence"] >= 8  # the same model decodes
    one = report["levels"]["1"]
    best = max(one[k]["tokens_per_s"] for k in ("ours_bf16", *quantized) if k in one)
    assert report["best_vs_q4km_c1"] == round(best / one["llama_q4_k_m"]["tokens_per_s"], 3)
    assert report["best_vs_q4km_c8"] is None  # no C=8 level in this run
    assert report["step_overhead_b1"] is None and "skipped" in report["step_overhead"]["why"]
    assert report["threads"] == 2 and report["versions"]["llama_cpp_python"]
    # --quick runs ours eager (compiling three variants would outlast the run), and says so
    assert report["workload"]["ours_compile"] is False
    assert report["workload"]["ours_compiled"] == {key: False for key in OURS} and "eager: ours_bf16" in run.stdout
    assert png.stat().st_size > 10_000 and "best_vs_q4km_c1" in run.stdout


def test_engines_started_are_stopped_when_a_later_one_fails(monkeypatch):
    import mstar_ros.bench.ours_decode as ours_decode
    from mstar_ros.bench.decode import DecodeBenchOptions, _Systems

    started, stopped = [], []

    class Decoder:
        def __init__(self, llm_dir, config):
            if len(started) == 2:
                raise RuntimeError("out of memory")
            started.append(self)

        def close(self):
            stopped.append(self)

    monkeypatch.setattr(ours_decode, "OursDecoder", Decoder)
    with pytest.raises(RuntimeError, match="out of memory"):
        _Systems(None, {}, DecodeBenchOptions(levels=[1]), per_stream=16)
    assert len(started) == 2 and stopped == started


_TEAMS_SCRIPT = """
import json, os, time, torch
torch.set_num_threads(2)
import mstar_ros.bench.decode as bench
from mstar_graphs.orpheus.checkpoints import resolve_paths
from mstar_ros.bench.gguf_files import ensure_gguf_files
bench.OURS = {"ours_bf16": "none"}
llm = resolve_paths(None, None, "tiny").llm
systems = bench._Systems(llm, ensure_gguf_files(llm, 2), bench.DecodeBenchOptions(levels=[1]), per_stream=40)
prompt = bench.prompts(1, 8, 0)


def threads(expected):
    # a released team's threads exit just after the call returns: wait up to 2 s for the count expected
    deadline = time.monotonic() + 2
    while len(os.listdir("/proc/self/task")) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(os.listdir("/proc/self/task"))


systems.run("ours_bf16", prompt, 8)
before = threads(-1)  # settled: ours holds its team of two (the device thread and one worker)
systems.run("llama_f16", prompt, 8)
after_llama = threads(before - 1)  # ours handed back before llama.cpp ran, llama.cpp's after
systems.run("ours_bf16", prompt, 8)
after_ours = threads(before)  # ours' team built again
systems.close()
print(json.dumps([before, after_llama, after_ours, systems.teams_released]))
"""


@pytest.mark.slow
def test_llama_cpp_and_ours_never_leave_two_openmp_teams():
    # llama.cpp's OpenMP team (on the bench's main thread, in torch's libgomp) would outlive its run,
    # and ours would live through llama.cpp's: two teams on 2 cores make libgomp stop spinning, which
    # slowed our decode 1.6x in every round
    run = subprocess.run([sys.executable, "-c", _TEAMS_SCRIPT], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    before, after_llama, after_ours, released = json.loads(run.stdout.strip().splitlines()[-1])
    assert released
    assert after_llama == before - 1, (before, after_llama)  # neither team left: one worker fewer
    assert after_ours == before, (before, after_ours)


def test_llama_cpp_extra_buffers_are_off_on_amx_cpus_unless_asked(monkeypatch):
    import torch

    from mstar_ros.bench.decode import DecodeBenchOptions, llama_extra_buffers

    for amx, expected in ((True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda amx=amx: {"amx_int8": amx})
        assert llama_extra_buffers(DecodeBenchOptions()) is expected
        assert llama_extra_buffers(DecodeBenchOptions(llama_extra_buffers=not expected)) is (not expected)
