"""``dtype: auto`` against forced bfloat16 and float32, on this machine, in one run: the numbers behind issue 33.

Runs ``mstar-ros bench qwen3-omni``, ``bench orpheus`` and ``bench pi05`` (small workloads, so one
run takes about half an hour on 2 cores) once per dtype -- auto, bfloat16, float32 -- one after
another in the same process tree, and writes each bench's JSON plus a table (JSON and Markdown) of
the figures that decide a dtype: Qwen3-Omni time to first audio and audio seconds per second at
C = 1 and 8 with the throughput ratio against transformers; Orpheus audio seconds per second and
tokens per second at C = 1 and 8 with the ratio; pi0.5 chunks per second at 1 and 4 robots and the
direct forward. The machine (CPU, ATen's dispatch, bf16 instructions) heads the table.

``--emulate-avx2`` runs the benches with ATen and oneDNN held to AVX2 (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2``): on a CPU with AVX512-BF16 that gives the kernels an AVX2-only CPU runs,
bf16 emulated included. Run nothing else meanwhile: the benches time the machine.

    python tools/dtype_compare.py --out out/dtype-compare [--emulate-avx2] [--benches qwen3-omni,orpheus,pi05]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DTYPES = ("auto", "bfloat16", "float32")
BENCHES = {
    "qwen3-omni": ["--concurrency", "1,8", "--rounds", "1", "--baseline-requests", "2"],
    "orpheus": ["--concurrency", "1,8", "--requests", "8", "--repeats", "1"],
    "pi05": ["--robots", "1,4", "--seconds", "4"],
}
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def run_bench(bench: str, dtype: str, out: Path, env: dict[str, str]) -> dict:
    stem = out / f"{bench}-{dtype}"
    cmd = [
        sys.executable,
        "-m",
        "mstar_ros.cli",
        "-q",
        "bench",
        bench,
        *BENCHES[bench],
        "--dtype",
        dtype,
        "--json",
        f"{stem}.json",
        "--plot",
        f"{stem}.png",
    ]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    (out / f"{bench}-{dtype}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"bench {bench} --dtype {dtype} failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(Path(f"{stem}.json").read_text())
    report["_wall_s"] = round(time.monotonic() - start, 1)
    return report


def row(bench: str, dtype: str, r: dict) -> dict:
    """The figures that decide a dtype, from one bench report."""
    ran = r["dtypes"]["ours"]["dtype"]
    out = {"bench": bench, "dtype": dtype, "ran": ran, "wall_s": r["_wall_s"]}
    if bench == "qwen3-omni":
        for c in ("1", "8"):
            o = r["levels"][c]["ours"]
            out[f"ttfa_p50_ms_c{c}"] = o["ttfa_ms"]["p50"]
            out[f"audio_s_per_s_c{c}"] = o["throughput_audio_s_per_s"]
        out["ratio_vs_transformers_c8"] = r["levels"]["8"]["throughput_ratio"]
        out["baseline_dtype"] = r["dtypes"]["baseline"]["dtype"]
    elif bench == "orpheus":
        for c in ("1", "8"):
            o = r["levels"][c]["ours"]
            out[f"audio_s_per_s_c{c}"] = o["throughput_audio_s_per_s"]
            out[f"tokens_per_s_c{c}"] = o["audio_tokens_per_s"]
            out[f"ttfa_p50_ms_c{c}"] = o["ttfa_p50_ms"]
        out["ratio_vs_transformers_c8"] = r["levels"]["8"]["throughput_ratio"]
        out["baseline_dtype"] = r["dtypes"]["baseline"]["dtype"]
    else:
        for n in ("1", "4"):
            out[f"chunks_per_s_{n}_robots"] = r["levels"][n]["ours"]["closed_loop"]["chunks_per_s"]
        out["direct_forward_ms"] = r["batching_bound"]["direct_forward_ms"]
        out["ratio_vs_direct_4_robots"] = r["levels"]["4"]["throughput_ratio"]
        out["baseline_dtype"] = r["dtypes"]["baseline"]["dtype"]
    return out


def markdown(machine: dict, rows: list[dict]) -> str:
    bf16 = ", ".join(machine.get("bf16_instructions", [])) or "none"
    limits = "".join(f", {k}={v}" for k, v in machine.get("isa_limits", {}).items())
    lines = [
        f"Machine: {machine.get('cpu')}, ATen dispatch {machine.get('cpu_capability')}, bf16 instructions: "
        f"{bf16}{limits}, {machine.get('threads')} threads, torch {machine.get('torch')}",
        "",
    ]
    for bench in BENCHES:
        mine = [r for r in rows if r["bench"] == bench]
        if not mine:
            continue
        keys = [k for k in mine[0] if k not in ("bench", "dtype", "ran")]
        lines += [
            f"`bench {bench}`",
            "",
            "| --dtype | ran | " + " | ".join(keys) + " |",
            "|---" * (len(keys) + 2) + "|",
        ]
        lines += ["| " + " | ".join([r["dtype"], r["ran"]] + [str(r[k]) for k in keys]) + " |" for r in mine]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("out/dtype-compare"), help="where the reports and table go")
    p.add_argument("--emulate-avx2", action="store_true", help="hold ATen and oneDNN to AVX2 in the benches")
    p.add_argument("--benches", default=",".join(BENCHES), help=f"which (default {','.join(BENCHES)})")
    args = p.parse_args(argv)
    benches = [b for b in args.benches.split(",") if b]
    unknown = set(benches) - set(BENCHES)
    if unknown:
        p.error(f"--benches: unknown {sorted(unknown)}; known: {', '.join(BENCHES)}")
    env = {**os.environ, **(AVX2 if args.emulate_avx2 else {})}
    args.out.mkdir(parents=True, exist_ok=True)
    rows, machine = [], {}
    for bench in benches:
        for dtype in DTYPES:
            report = run_bench(bench, dtype, args.out, env)
            machine = machine or report["machine"]
            rows.append(row(bench, dtype, report))
            print(json.dumps(rows[-1]), flush=True)
    table = markdown(machine, rows)
    (args.out / "table.md").write_text(table + "\n")
    (args.out / "table.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
