"""PNG plot of ``bench decode``: tokens/s of each system at each concurrency, ours beside llama.cpp."""

from __future__ import annotations

from pathlib import Path

from mstar_ros.bench.machine import layout_with_caption

_COLORS = {"ours": "tab:blue", "llama": "tab:orange"}


def plot_decode(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mstar_ros.bench.decode import ORDER

    levels = list(report["levels"].items())
    fig, axes = plt.subplots(1, len(levels), figsize=(6.5 * len(levels), 4), squeeze=False)
    for ax, (c, level) in zip(axes[0], levels):
        names = ORDER
        values = [level[k]["tokens_per_s"] if k in level else 0.0 for k in names]
        colors = [_COLORS[k.split("_")[0]] for k in names]
        bars = ax.bar(range(len(names)), values, color=colors)
        for bar, key, value in zip(bars, names, values):
            ax.annotate(
                "n/a" if key not in level else f"{value:.0f}",
                (bar.get_x() + bar.get_width() / 2, value),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(range(len(names)), [n.replace("_", "\n", 1) for n in names], fontsize=8)
        ax.set(title=f"C={c} greedy streams", ylabel="decode tokens/s")
        ax.grid(axis="y", alpha=0.3)
    m = report["model"]
    note = " (random weights)" if m.get("random_weights") else ""
    fig.suptitle(
        f"Orpheus LLM decode{note}: {m['params_m']}M params, LM head {m['lm_head_share']:.0%}, "
        f"{report['threads']} threads"
    )
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
