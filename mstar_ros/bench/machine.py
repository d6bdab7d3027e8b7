"""What every benchmark report says about where it ran: the machine, and the dtype each system ran.

A figure means little without them: the same run is 2.5-2.7x apart in bf16 between a CPU with
bf16 instructions and an AVX2-only one (mstar.engine.dtype_choice).
"""

from __future__ import annotations

import platform

import torch

from mstar.engine.dtype_choice import DtypeChoice, machine_report


def machine_section(device: str | torch.device = "cpu") -> dict:
    """CPU, its capability (ATen's dispatch), bf16 instructions, threads, torch, python, device."""
    return {**machine_report(device), "python": platform.python_version()}


def dtypes_section(ours: DtypeChoice, baseline: str | None, baseline_why: str) -> dict:
    """``{"ours": {dtype, requested, reason}, "baseline": {dtype, why}}`` (baseline None: there is none)."""
    out: dict = {"ours": ours.as_dict()}
    if baseline is not None:
        out["baseline"] = {"dtype": baseline, "why": baseline_why}
    return out


def _bf16_and_limits(m: dict, joiner: str, none: str) -> tuple[str, str]:
    """A machine section's bf16 instructions (joined, or ``none``) and its ISA limits (", K=V" each)."""
    return (
        joiner.join(m.get("bf16_instructions", [])) or none,
        "".join(f", {k}={v}" for k, v in m.get("isa_limits", {}).items()),
    )


def header_line(report: dict) -> str:
    """One line for the printed summary: where it ran and in what dtypes."""
    m = report.get("machine", {})
    bf16, limits = _bf16_and_limits(m, ", ", "none")
    line = (
        f"machine: {m.get('cpu', '?')}, {m.get('cpu_capability', '?')} dispatch, bf16 instructions: {bf16}{limits}, "
        f"{m.get('threads', '?')} threads, torch {m.get('torch', '?')}"
    )
    d = report.get("dtypes", {})
    if "ours" in d:
        o = d["ours"]
        line += f"; ours {o['dtype']} ({'auto: ' if o['requested'] == 'auto' else ''}{o['reason']})"
    if "baseline" in d:
        line += f"; baseline {d['baseline']['dtype']} ({d['baseline']['why']})"
    return line


def caption(report: dict) -> str:
    """A plot's footnote: the CPU, its dispatch and bf16 instructions, threads, and each system's dtype."""
    m, d = report.get("machine", {}), report.get("dtypes", {})
    bf16, limits = _bf16_and_limits(m, "+", "no bf16 instructions")
    text = f"{m.get('cpu', '?')}, {m.get('cpu_capability', '?')} ({bf16}{limits}), {m.get('threads', '?')} threads"
    if "ours" in d:
        text += f"; ours {d['ours']['dtype']}" + (" (auto)" if d["ours"]["requested"] == "auto" else "")
    if "baseline" in d:
        text += f", baseline {d['baseline']['dtype']}"
    return text


def layout_with_caption(fig, report: dict) -> None:
    """``fig.tight_layout()`` leaving a line at the bottom for :func:`caption`."""
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    fig.text(0.5, 0.008, caption(report), ha="center", va="bottom", fontsize=7, color="0.35")
