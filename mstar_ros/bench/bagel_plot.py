"""The PNG of ``mstar-ros bench bagel``: image latency with its bound, time to first token, throughput."""

from __future__ import annotations

from mstar_ros.bench.machine import layout_with_caption


def plot_bagel(report: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (images, ttft, tp) = plt.subplots(1, 3, figsize=(14, 4.2))
    tasks = ["edit", "t2i"]
    xs = range(len(tasks))
    width = 0.38
    ours = [report[t]["ours_s"] for t in tasks]
    ref = [report[t]["reference_s"] for t in tasks]
    images.bar([x - width / 2 for x in xs], ours, width, label="ours (views in one step)")
    images.bar([x + width / 2 for x in xs], ref, width, label="reference (3 forwards per step)")
    for x, t in zip(xs, tasks):
        r = report[t]
        images.annotate(
            f"{r['speedup']:.2f}x (bound {r['bound']:.2f}x)",
            (x, max(r["ours_s"], r["reference_s"])),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    images.set_xticks(list(xs), ["editing", "text to image"])
    images.set(title="Image latency, one request", ylabel="s")
    images.margins(y=0.15)

    levels = sorted(report["chat"]["levels"], key=int)
    cs = [int(c) for c in levels]
    lv = report["chat"]["levels"]
    ttft.plot(cs, [lv[c]["ttft_ms"]["p50"] for c in levels], "o-", label="ours p50")
    ttft.plot(
        cs, [lv[c]["reference"]["ttft_ms_if_streamed"]["p50"] for c in levels], "^--", label="reference, streamed"
    )
    ttft.plot(cs, [lv[c]["reference"]["ttft_ms_as_served"]["p50"] for c in levels], "s:", label="reference, as served")
    ttft.set(title="Image to text: time to first token", xlabel="concurrent requests", ylabel="ms", yscale="log")
    tp.plot(cs, [lv[c]["tokens_per_s"] for c in levels], "o-", label="ours")
    tp.plot(cs, [lv[c]["reference"]["tokens_per_s"] for c in levels], "^--", label="reference, one at a time")
    tp.set(title="Image to text: throughput", xlabel="concurrent requests", ylabel="tokens / s")
    for ax in (ttft, tp):
        ax.set_xticks(cs)
    for ax in (images, ttft, tp):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    note = " (random weights)" if report["model"].get("random_weights") else ""
    fig.suptitle(f"BAGEL on mstar_ros vs the reference inferencer's algorithm, same modules{note}")
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
