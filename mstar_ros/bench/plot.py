"""PNG plots of benchmark reports (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from mstar_ros.bench.machine import layout_with_caption


def plot_orpheus(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(report["levels"], key=int)
    xs = [int(c) for c in levels]
    fig, (tp, ttfa) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in (("ours", "o-"), ("baseline_sequential", "s--"), ("baseline_static", "^--")):
        tp.plot(xs, [report["levels"][c][name]["throughput_audio_s_per_s"] for c in levels], style, label=name)
        ttfa.plot(xs, [report["levels"][c][name]["ttfa_p50_ms"] for c in levels], style, label=name)
    tp.set(title="Throughput (audio seconds per wall second)", xlabel="concurrency", ylabel="audio s / s")
    ttfa.set(title="Time to first audio, p50", xlabel="concurrency", ylabel="ms", yscale="log")
    for ax in (tp, ttfa):
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend()
    note = " (random weights)" if report["model"].get("random_weights") else ""
    fig.suptitle(f"Orpheus TTS on mstar_ros vs transformers generate() + snac{note}")
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
