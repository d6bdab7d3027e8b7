"""Probe (issue 28, point 10): what hostile or broken YAML files cost the loaders a user's files go through.

    python tools/probe_yaml_aliases.py [--levels 9] [--timeout 20] [--max-rss-mb 3000] [--json out.json]

Each case runs in a fresh process loading one generated file: a "billion laughs" placement
file (``--levels`` nested anchors of nine aliases each: 544 bytes and 387 million values at 9 levels), the same
laughs in an engine config, a placement file cut off mid-list, and one nested 10000
levels deep. Printed per case: how it ended (refused, loaded, killed), the seconds it took,
the loader's peak RSS growth over its baseline, and its message. A case is killed once it
passes ``--timeout`` seconds or ``--max-rss-mb`` of growth, so the probe itself is safe.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import sys, time
from pathlib import Path
from mstar.engine.config import load_engine_config
from mstar.placement.schema import PlacementFile
def rss_kb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
print("baseline", rss_kb(), flush=True)
loader, path = sys.argv[1], sys.argv[2]
start = time.monotonic()
try:
    (PlacementFile.load if loader == "placement" else load_engine_config)(path)
    outcome, message = "loaded", ""
except Exception as exc:
    outcome, message = "refused", f"{type(exc).__name__}: {exc}"
print("done", outcome, time.monotonic() - start, message.replace("\n", "\\n"), sep="\t", flush=True)
"""

PLACEMENT_TAIL = "node_groups:\n  - {nodes: [llm], ranks: [0]}\n"


def laughs(levels: int) -> str:
    """``levels`` anchors, each a list of nine aliases of the one before: 9**levels leaves once expanded."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def cases(levels: int) -> dict[str, tuple[str, str]]:
    return {
        "placement-aliases": ("placement", "world_size: 1\n" + laughs(levels) + PLACEMENT_TAIL),
        "engine-aliases": ("engine", laughs(levels)),
        "placement-truncated": ("placement", "world_size: 2\nnode_groups:\n  - nodes: [llm\n"),
        "placement-deep": ("placement", "world_size: 1\nnode_groups: " + "[" * 10000 + "\n"),
    }


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run_case(loader: str, text: str, timeout: float, max_rss_mb: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hostile.yaml"
        path.write_text(text)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, loader, str(path)], stdout=subprocess.PIPE, text=True, env=env
        )
        baseline_kb = int(proc.stdout.readline().split()[1])
        start, peak_kb, killed = time.monotonic(), baseline_kb, ""
        while proc.poll() is None:
            peak_kb = max(peak_kb, _status_kb(proc.pid, "VmHWM") or 0)
            growth_mb = (peak_kb - baseline_kb) / 1024
            if time.monotonic() - start > timeout or growth_mb > max_rss_mb:
                killed = f"killed after {time.monotonic() - start:.1f}s at +{growth_mb:.0f} MB"
                proc.kill()
                break
            time.sleep(0.05)
        out = proc.communicate()[0]
    result = {
        "bytes": len(text.encode()),
        "seconds": round(time.monotonic() - start, 3),
        "rss_growth_mb": round((peak_kb - baseline_kb) / 1024, 1),
    }
    if killed:
        return {**result, "outcome": "killed", "message": killed}
    fields = out.strip().split("\t")
    if fields[0] != "done":
        return {**result, "outcome": "crashed", "message": out.strip()[-300:]}
    return {**result, "outcome": fields[1], "seconds": round(float(fields[2]), 3), "message": fields[3]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--levels", type=int, default=9, help="nested anchors in the laughs cases (default 9: 387 million values)"
    )
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a case is killed (default 20)")
    p.add_argument(
        "--max-rss-mb", type=float, default=3000.0, help="RSS growth at which a case is killed (default 3000)"
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    results = {}
    for name, (loader, text) in cases(args.levels).items():
        results[name] = r = run_case(loader, text, args.timeout, args.max_rss_mb)
        print(
            f"{name:22s} {r['outcome']:8s} {r['bytes']:6d} B {r['seconds']:7.2f} s {r['rss_growth_mb']:8.1f} MB  "
            f"{r['message'][:200]}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
