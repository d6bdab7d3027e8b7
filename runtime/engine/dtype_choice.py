"""``dtype: auto``: the fastest dtype this machine runs natively, chosen once per process and device, and why.

bfloat16 halves the bytes of every weight, and where the CPU has bf16 dot-product instructions
(AVX512-BF16, AMX-BF16) the engines' bf16 linears ran 3-8x faster than fp32 (an MLP block of width
1024 on an AMD EPYC with AVX512-BF16). A CPU without them emulates bf16: on an AVX2-only EPYC whole
benchmarks ran 2.5-2.7x *slower* in bf16 than in fp32 (Qwen3-Omni at 8 streams: 2.24 against 6.15
audio seconds per second), and with ATen and oneDNN held to AVX2, 1.2-4x slower from 8 rows on (only
one stream's decode, which streams every weight for one row, gained from the halved bytes). So no
dtype is right everywhere; ``auto`` decides from the machine:

CPU, x86-64, in order:
  1. ATen dispatches below AVX512 (an AVX2-only CPU, or ``ATEN_CPU_CAPABILITY`` lowered it): float32,
     bf16 would be emulated;
  2. oneDNN has no bf16 path (the build, or ``ONEDNN_MAX_CPU_ISA`` lowered it): float32;
  3. AMX-BF16 or AVX512-BF16 instructions: bfloat16, native;
  4. AVX512 without bf16 instructions: not decidable from the flags (oneDNN emulates bf16 on AVX512,
     memory-bound decode may still gain): measured.
Other CPUs: no bf16 instructions: float32; else measured.
CUDA: bfloat16 where the GPU has it, else float32 (float16 overflows in models trained in bf16).

The measurement times a model-shaped block (two linears, 1024 <-> 4096, as the engines run them:
bf16 weights prepacked for oneDNN) at 1, 8, 64 and 256 rows in both dtypes, on the device thread,
and takes bf16 only if its time is under 0.9x fp32's in geometric mean over the row counts (bf16
costs precision: it has to pay). It takes about a second and is kept per machine (CPU, flags, ISA
limits, torch version, threads) in ``$MSTAR_CACHE/dtype-auto.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from mstar.cache_dir import cache_root
from mstar.engine.dtype_names import DTYPE_NAMES

log = logging.getLogger("mstar.engine")

#: bf16 must take less than this share of fp32's time (geometric mean over row counts) to be chosen
MEASURE_THRESHOLD = 0.9
MEASURE_ROWS = (1, 8, 64, 256)
_X86_BF16 = ("amx_bf16", "avx512_bf16")
_ARM_BF16 = ("sve_bf16", "bf16")
_CACHE_FILE = "dtype-auto.json"


@dataclass(frozen=True)
class CpuProfile:
    """What decides the CPU's dtype: the CPU, its bf16 instructions and what torch dispatches to."""

    name: str
    architecture: str
    capability: str  # torch.backends.cpu.get_cpu_capability(): ATen's kernels (AVX2, AVX512, ...)
    bf16_instructions: tuple[str, ...]
    onednn_bf16: bool  # oneDNN runs bf16 here (ONEDNN_MAX_CPU_ISA lowers it)
    threads: int
    isa_limits: tuple[tuple[str, str], ...] = ()  # ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA when set

    @classmethod
    def detect(cls, threads: int | None = None) -> CpuProfile:
        caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
        arch = str(caps.get("architecture", os.uname().machine))
        flags = _X86_BF16 if arch in ("x86_64", "x86") else _ARM_BF16
        try:
            onednn = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            onednn = False
        limits = tuple((k, os.environ[k]) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k))
        return cls(
            name=str(caps.get("cpu_name", "") or "unknown"),
            architecture=arch,
            capability=torch.backends.cpu.get_cpu_capability(),
            bf16_instructions=tuple(f for f in flags if caps.get(f)),
            onednn_bf16=onednn,
            threads=threads or torch.get_num_threads(),
            isa_limits=limits,
        )

    @property
    def x86(self) -> bool:
        return self.architecture in ("x86_64", "x86")

    def fingerprint(self) -> str:
        """The measurement cache's key: whatever could change the answer."""
        text = json.dumps([asdict(self), torch.__version__], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        """For benchmark reports: the machine a figure was taken on."""
        out = {
            "cpu": self.name,
            "architecture": self.architecture,
            "cpu_capability": self.capability,
            "bf16_instructions": list(self.bf16_instructions),
            "onednn_bf16": self.onednn_bf16,
            "threads": self.threads,
        }
        if self.isa_limits:
            out["isa_limits"] = dict(self.isa_limits)
        return out

    def summary(self) -> str:
        """One line: "AMD EPYC, AVX512 dispatch, bf16 instructions: avx512_bf16, 2 threads"."""
        bf16 = ", ".join(self.bf16_instructions) or "none"
        limits = "".join(f", {k}={v}" for k, v in self.isa_limits)
        return f"{self.name}, {self.capability} dispatch, bf16 instructions: {bf16}{limits}, {self.threads} threads"


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype an engine runs and why (``requested`` is what the config said: ``auto`` or a name)."""

    dtype: str
    requested: str
    reason: str
    measured: dict | None = field(default=None, compare=False)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def describe(self) -> str:
        """ "bfloat16 (auto: ...)" or "float32 (set explicitly)"."""
        return f"{self.dtype} ({'auto: ' if self.requested == 'auto' else ''}{self.reason})"

    def as_dict(self) -> dict:
        out = {"dtype": self.dtype, "requested": self.requested, "reason": self.reason}
        if self.measured:
            out["measured"] = self.measured
        return out


def check_dtype_name(name: str, what: str = "dtype") -> str:
    """``name`` if it is one of :data:`DTYPE_NAMES`, else a ValueError naming ``what``."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"{what}: expected one of {', '.join(DTYPE_NAMES)}, got {name!r}")
    return name


def decide_cpu(profile: CpuProfile, measure: Callable[[], dict]) -> DtypeChoice:
    """The rules of this module's docstring; ``measure()`` is called only where they cannot decide."""

    def pick(dtype: str, reason: str) -> DtypeChoice:
        return DtypeChoice(dtype, "auto", reason)

    if profile.x86:
        if not profile.capability.startswith("AVX512"):
            why = (
                f"ATen dispatches {profile.capability} kernels"
                if profile.bf16_instructions
                else f"{profile.capability} CPU without bf16 instructions"
            )
            return pick("float32", f"{why}: bf16 would be emulated, 1.2-4x slower than float32 at 8 rows and more")
        if not profile.onednn_bf16:
            return pick("float32", "oneDNN has no bf16 path here: bf16 would be emulated")
        if profile.bf16_instructions:
            return pick("bfloat16", f"native bf16 ({', '.join(profile.bf16_instructions)})")
    elif not profile.bf16_instructions:
        return pick("float32", f"{profile.architecture} CPU without bf16 instructions: bf16 would be emulated")
    result = measure()
    ratio = result["bf16_over_fp32"]
    dtype = "bfloat16" if ratio < MEASURE_THRESHOLD else "float32"
    return DtypeChoice(
        dtype,
        "auto",
        f"measured: bf16 linears take {ratio:.2f}x fp32's time "
        f"({'under' if dtype == 'bfloat16' else 'not under'} {MEASURE_THRESHOLD})",
        result,
    )


def decide_cuda(device: torch.device) -> DtypeChoice:
    if torch.cuda.is_bf16_supported():
        return DtypeChoice("bfloat16", "auto", f"{torch.cuda.get_device_name(device)} runs bf16 natively")
    return DtypeChoice(
        "float32",
        "auto",
        f"{torch.cuda.get_device_name(device)} has no bf16; float16 overflows in models trained in bf16",
    )


def measure_linears(width: int = 1024, hidden: int = 4096, rows: tuple[int, ...] = MEASURE_ROWS, reps: int = 5) -> dict:
    """Best-of-``reps`` milliseconds of a two-linear block per row count in float32 and bfloat16 (bf16
    weights prepacked as the engines pack them), and bf16's time over fp32's in geometric mean."""
    from torch import nn

    from mstar.layers.linear_packing import pack_linears

    gen = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(hidden, width, generator=gen) / 32, torch.randn(width, hidden, generator=gen) / 64
    timings: dict[str, dict[int, float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        block = nn.Sequential(nn.Linear(width, hidden, bias=False), nn.GELU(), nn.Linear(hidden, width, bias=False))
        with torch.no_grad():
            block[0].weight.copy_(w1)
            block[2].weight.copy_(w2)
        block = block.to(dtype).eval()
        pack_linears(block)
        per_rows = {}
        with torch.inference_mode():
            for n in rows:
                x = torch.randn(n, width, generator=gen).to(dtype)
                block(x)  # warm: first calls allocate and pick kernels
                best = math.inf
                for _ in range(reps):
                    start = time.perf_counter()
                    block(x)
                    best = min(best, time.perf_counter() - start)
                per_rows[n] = round(best * 1000, 4)
        timings[str(dtype).removeprefix("torch.")] = per_rows
    ratios = [timings["bfloat16"][n] / max(timings["float32"][n], 1e-9) for n in rows]
    return {
        "block": f"linear {width}->{hidden}, gelu, linear {hidden}->{width}",
        "rows": list(rows),
        "float32_ms": list(timings["float32"].values()),
        "bfloat16_ms": list(timings["bfloat16"].values()),
        "bf16_over_fp32": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
    }


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process measures at a time (Worker processes of one host start together)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_measurement(profile: CpuProfile, measure: Callable[[], dict] = measure_linears) -> Callable[[], dict]:
    """``measure`` behind the per-machine cache file (a missing or unreadable file is measured again)."""

    def run() -> dict:
        path = cache_root() / _CACHE_FILE
        key = profile.fingerprint()
        with _locked(path):
            try:
                known = json.loads(path.read_text())
                if not isinstance(known, dict):
                    raise ValueError("not a mapping")
            except FileNotFoundError:
                known = {}
            except (OSError, ValueError) as exc:
                log.warning("%s unreadable (%s): measuring again", path, exc)
                known = {}
            entry = known.get(key)
            if isinstance(entry, dict) and isinstance(entry.get("bf16_over_fp32"), (int, float)):
                return {**entry, "cached": str(path)}
            log.info("dtype auto: measuring bf16 against fp32 on this machine (%s), once", profile.summary())
            result = {**measure(), "profile": profile.as_dict(), "torch": torch.__version__}
            known[key] = result
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(known, indent=1) + "\n")
            tmp.replace(path)
            return result

    return run


_chosen: dict[str, DtypeChoice] = {}
_lock = threading.Lock()


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> DtypeChoice:
    """The dtype to run on ``device`` for a config's ``name`` (``auto`` or a dtype name). ``auto`` is
    decided once per process and device, and logged with its reason."""
    check_dtype_name(name)
    if name != "auto":
        return DtypeChoice(name, name, "set explicitly")
    device = torch.device(device)
    key = str(device)
    with _lock:
        choice = _chosen.get(key)
    if choice is not None:
        return choice
    if device.type == "cuda":
        choice, where = decide_cuda(device), ""
    else:
        from mstar.engine.device_loop import run_on_device

        profile = CpuProfile.detect(_model_threads())
        # measured (where the rules cannot decide) on the device thread, where the engines run, with
        # their width; only that thread takes the cache's file lock, so no two threads wait on each other
        choice = decide_cpu(profile, lambda: run_on_device(cached_measurement(profile)))
        where = f" [{profile.summary()}]"
    with _lock:
        if key not in _chosen:
            _chosen[key] = choice
            log.info("dtype auto on %s: %s%s", key, choice.describe(), where)
        return _chosen[key]


def _model_threads() -> int:
    from mstar.engine.intra_op import model_threads

    return model_threads()


def machine_report(device: str | torch.device = "cpu") -> dict:
    """The machine a benchmark ran on: CPU profile (capability, bf16 instructions, threads), torch, device."""
    out = {**CpuProfile.detect(_model_threads()).as_dict(), "torch": torch.__version__, "device": str(device)}
    if torch.device(device).type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
