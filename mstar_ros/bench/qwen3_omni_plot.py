"""The PNG of ``mstar-ros bench qwen3-omni``: time to first audio and throughput, ours vs transformers."""

from __future__ import annotations

from mstar_ros.bench.machine import layout_with_caption


def plot_omni(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(report["levels"], key=int)
    xs = [int(c) for c in levels]
    fig, (ttfa, tp) = plt.subplots(1, 2, figsize=(11, 4))
    ttfa.plot(xs, [report["levels"][c]["ours"]["ttfa_ms"]["p50"] for c in levels], "o-", label="ours p50")
    ttfa.plot(xs, [report["levels"][c]["ours"]["ttfa_ms"]["p95"] for c in levels], "s-", label="ours p95")
    ttfa.plot(
        xs,
        [report["levels"][c]["baseline_sequential"]["ttfa_ms"]["p50"] for c in levels],
        "^--",
        label="transformers, one at a time, p50",
    )
    ttfa.set(title="Time to first audio", xlabel="concurrent requests", ylabel="ms", yscale="log")
    tp.plot(xs, [report["levels"][c]["ours"]["throughput_audio_s_per_s"] for c in levels], "o-", label="ours")
    tp.plot(
        xs,
        [report["levels"][c]["baseline_sequential"]["throughput_audio_s_per_s"] for c in levels],
        "^--",
        label="transformers, one at a time",
    )
    tp.set(title="Throughput (audio seconds per second)", xlabel="concurrent requests", ylabel="audio s / s")
    for ax in (ttfa, tp):
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend()
    note = " (random weights)" if report["model"].get("random_weights") else ""
    fig.suptitle(f"Qwen3-Omni on mstar_ros vs transformers generate(return_audio=True){note}")
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
