"""The printed summary and the PNG of ``mstar-ros bench mixed``."""

from __future__ import annotations

from pathlib import Path

from mstar_ros.bench.machine import header_line, layout_with_caption


def report_lines(report: dict) -> list[str]:
    alone, loaded, one, off = report["alone"], report["loaded"], report["one_process"], report["classes_off"]
    lines = [
        header_line(report),
        f"robots alone: p50 {alone['p50_ms']} ms, p95 {alone['p95_ms']} ms ({alone['chunks']} chunks); "
        f"voice alone: RTF p95 {alone['voice']['rtf_p95']} ({alone['voice']['answers']} answers; its forward "
        f"{'compiled' if report.get('voice_engine', {}).get('forward_compiled') else 'eager'})",
        f"loaded (images in an idle process): p95 {loaded['p95_ms']} ms -> control_p95_ratio {report['control_p95_ratio']} "
        f"(goal <= 1.25), late chunks {_pct(loaded['late_share'])} (refill point {report['refill_deadline_ms']} ms; "
        f"goal < 1%), voice RTF p95 {loaded['voice']['rtf_p95']}, {loaded['images']} images",
    ]
    for name, run in (("one process, classes on", one), ("one process, classes off", off)):
        lines.append(
            f"{name}: p95 {run['p95_ms']} ms -> control_p95_ratio {run['control_p95_ratio']}, late "
            f"chunks {_pct(run['late_share'])}, voice RTF p95 {run['voice']['rtf_p95']}, {run['images']} images"
        )
    runs = (("alone", alone), ("loaded", loaded), ("one process", one), ("classes off", off))
    for name, run in runs:
        where = run.get("chunk_device_ms")
        if where:
            for by in (b for b in ("class", "engine") if b in where["median"]):
                median, slowest = where["median"][by], where["slowest_5pct"][by]
                lines.append(
                    f"  {name}: a chunk's window by {by}, ms (median chunk | slowest 5%): "
                    + ", ".join(f"{k} {median.get(k, 0.0)} | {slowest.get(k, 0.0)}" for k in {**median, **slowest})
                )
    if report["workload"]["random_weights"]:
        lines.append("(RANDOM weights: latencies are real, the actions, audio and images are noise)")
    return lines


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def plot_mixed(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [
        ("alone", report["alone"]),
        ("loaded\n(images idle)", report["loaded"]),
        ("one process\nclasses on", report["one_process"]),
        ("one process\nclasses off", report["classes_off"]),
    ]
    names = [name for name, _ in runs]
    fig, (control, voice) = plt.subplots(1, 2, figsize=(13, 4))
    xs = range(len(runs))
    control.bar([x - 0.2 for x in xs], [r["p50_ms"] or 0 for _, r in runs], 0.4, label="p50")
    control.bar([x + 0.2 for x in xs], [r["p95_ms"] or 0 for _, r in runs], 0.4, label="p95")
    control.axhline(report["refill_deadline_ms"], color="red", linestyle="--", label="refill point")
    control.set(title=f"pi0.5 sensor-to-action, {report['workload']['robots']} robots", ylabel="ms")
    voice.bar(xs, [r["voice"]["rtf_p95"] or 0 for _, r in runs], 0.5)
    voice.axhline(1.0, color="red", linestyle="--", label="real time")
    voice.set(title=f"voice RTF p95, {report['workload']['voice_peers']} peers", ylabel="generation s / audio s")
    for ax in (control, voice):
        ax.set_xticks(list(xs), names)
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
    fig.suptitle("One edge box: control beside voice and a batch image job")
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
