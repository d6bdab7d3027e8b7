"""dtype: auto -- what it picks for each kind of machine, the measurement and its cache, and the real machine."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from mstar.engine.config import EngineConfig
from mstar.engine.dtype_choice import CpuProfile, cached_measurement, decide_cpu, measure_linears, resolve_dtype


def profile(
    capability: str = "AVX512",
    bf16: tuple[str, ...] = ("avx512_bf16",),
    onednn: bool = True,
    arch: str = "x86_64",
    threads: int = 2,
) -> CpuProfile:
    return CpuProfile(
        name="test cpu",
        architecture=arch,
        capability=capability,
        bf16_instructions=bf16,
        onednn_bf16=onednn,
        threads=threads,
    )


def never() -> dict:
    raise AssertionError("the flags decide this machine: nothing should be measured")


def measured(ratio: float):
    calls = []

    def measure() -> dict:
        calls.append(1)
        return {"bf16_over_fp32": ratio}

    return measure, calls


@pytest.mark.parametrize(
    "machine, dtype, why",
    [
        (profile("AVX2", ()), "float32", "AVX2 CPU without bf16 instructions"),  # an AVX2-only EPYC
        (profile("DEFAULT", ()), "float32", "emulated"),
        (profile("AVX2", ("avx512_bf16",)), "float32", "ATen dispatches AVX2"),  # ATEN_CPU_CAPABILITY=avx2
        (profile("AVX512", ("avx512_bf16",), onednn=False), "float32", "oneDNN"),  # ONEDNN_MAX_CPU_ISA lowered
        (profile("AVX512", ("avx512_bf16",)), "bfloat16", "native bf16 (avx512_bf16)"),  # Zen 4, Cooper Lake
        (profile("AVX512", ("amx_bf16", "avx512_bf16")), "bfloat16", "amx_bf16"),  # Sapphire Rapids
        (profile("SVE256", (), arch="aarch64"), "float32", "aarch64 CPU without bf16"),
    ],
)
def test_auto_picks_from_the_flags_where_they_decide(machine, dtype, why):
    choice = decide_cpu(machine, never)
    assert choice.dtype == dtype and choice.requested == "auto"
    assert why in choice.reason


@pytest.mark.parametrize(
    "machine",
    [
        profile("AVX512", ()),  # Skylake-X: oneDNN emulates bf16
        profile("SVE256", ("bf16",), arch="aarch64"),
    ],
)
@pytest.mark.parametrize("ratio, dtype", [(0.5, "bfloat16"), (0.95, "float32"), (2.7, "float32")])
def test_auto_measures_where_the_flags_cannot_tell(machine, ratio, dtype):
    measure, calls = measured(ratio)
    choice = decide_cpu(machine, measure)
    assert calls == [1]
    assert choice.dtype == dtype and "measured" in choice.reason and choice.measured == {"bf16_over_fp32": ratio}


def test_the_measurement_times_both_dtypes_as_the_engines_run_them():
    result = measure_linears(width=64, hidden=128, rows=(1, 16), reps=2)
    assert result["rows"] == [1, 16]
    assert len(result["float32_ms"]) == len(result["bfloat16_ms"]) == 2
    assert all(t > 0 for t in result["float32_ms"] + result["bfloat16_ms"])
    expected = (
        result["bfloat16_ms"][0] / result["float32_ms"][0] * result["bfloat16_ms"][1] / result["float32_ms"][1]
    ) ** 0.5
    assert result["bf16_over_fp32"] == pytest.approx(expected, rel=0.01)


def test_the_measurement_is_kept_per_machine(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MSTAR_CACHE", str(tmp_path))
    measure, calls = measured(0.4)
    machine = profile("AVX512", ())
    first = cached_measurement(machine, measure)()
    again = cached_measurement(machine, measure)()
    assert calls == [1] and first["bf16_over_fp32"] == again["bf16_over_fp32"] == 0.4
    assert "cached" in again and "cached" not in first
    assert (
        json.loads((tmp_path / "dtype-auto.json").read_text())[machine.fingerprint()]["profile"]["cpu_capability"]
        == "AVX512"
    )
    cached_measurement(profile("AVX512", (), threads=1), measure)()  # another width is another machine
    assert calls == [1, 1]
    (tmp_path / "dtype-auto.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="mstar.engine"):
        cached_measurement(machine, measure)()
    assert calls == [1, 1, 1] and "unreadable" in caplog.text


def test_explicit_dtypes_pass_through_and_unknown_names_are_refused():
    for name in ("float32", "bfloat16", "float16"):
        choice = resolve_dtype(name)
        assert (choice.dtype, choice.requested, choice.reason) == (name, name, "set explicitly")
    with pytest.raises(ValueError, match="dtype: expected one of auto, float32, bfloat16, float16, got 'bf16'"):
        resolve_dtype("bf16")


def test_auto_on_this_machine_is_what_its_profile_decides(tmp_path, monkeypatch):
    monkeypatch.setenv("MSTAR_CACHE", str(tmp_path))
    machine = CpuProfile.detect()
    assert machine.capability == torch.backends.cpu.get_cpu_capability()
    choice = resolve_dtype("auto")
    assert choice.dtype == decide_cpu(machine, cached_measurement(machine)).dtype
    assert resolve_dtype("auto") is choice  # decided once per process and device


def test_an_avx2_machine_gets_float32():
    """The real detection with ATen and oneDNN held to AVX2 (the kernels an AVX2-only CPU runs): float32,
    and the log says why. Any x86-64 CPU of these machines runs AVX2."""
    code = (
        "import logging, torch; logging.basicConfig(level=logging.INFO)\n"
        "from mstar.engine.dtype_choice import resolve_dtype\n"
        "print(torch.backends.cpu.get_cpu_capability(), resolve_dtype('auto').dtype)"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["AVX2", "float32"]
    assert "dtype auto on cpu: float32 (auto:" in run.stderr and "bf16 would be emulated" in run.stderr
    assert "ATEN_CPU_CAPABILITY=avx2" in run.stderr  # the limit that decided it is named


def test_engine_config_defaults_to_auto_and_makes_it_concrete_per_device():
    config = EngineConfig()
    assert config.dtype == "auto"
    concrete, choice = config.for_device("cpu")
    assert concrete.dtype == choice.dtype == resolve_dtype("auto").dtype
    kept, explicit = EngineConfig(dtype="float32").for_device("cpu")
    assert kept.dtype == "float32" and explicit.reason == "set explicitly"
    with pytest.raises(ValueError, match="dtype = 'bf16' is invalid .expected one of auto, float32"):
        EngineConfig(dtype="bf16")


def test_an_embedded_conductor_runs_the_auto_dtype_and_says_so():
    import asyncio

    from mstar.conductor import Conductor
    from support.conductor_helpers import req
    from support.toy_graphs import lm_graph
    from support.toy_models import ToyLM

    lm = ToyLM()

    async def main():
        async with Conductor(lm_graph(), {"llm": lm}) as c:  # the default engine config: dtype auto
            out = await c.submit(req([1, 2, 3], 4)).collect()
            return out, c.worker_status(), c.dtype_summary()

    out, (status,), summary = asyncio.run(main())
    expected = resolve_dtype("auto")
    assert len(out["token"]) == 4
    assert next(lm.parameters()).dtype == expected.torch_dtype  # the engine cast the module to it
    assert (status.dtype, status.dtype_reason, summary) == (expected.dtype, expected.describe(), expected.describe())
