"""PNG plot of the pi0.5 serving benchmark (matplotlib, headless), in the style of plot.py."""

from __future__ import annotations

from pathlib import Path

from mstar_ros.bench.machine import layout_with_caption


def plot_pi05(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(report["levels"], key=int)
    xs = [int(n) for n in levels]
    fig, (tp, lat) = plt.subplots(1, 2, figsize=(11, 4))
    inflight = report.get("ours", {}).get("max_inflight")
    ours = "ours (one Conductor" + (f", {inflight} in flight)" if isinstance(inflight, int) else ")")
    systems = (("ours", ours, "C0"), ("baseline", "direct, one call per observation", "C1"))
    for name, label, color in systems:
        figures = [report["levels"][n][name] for n in levels]
        tp.plot(xs, [f["closed_loop"]["chunks_per_s"] for f in figures], "o-", color=color, label=label)
        lat.plot(xs, [f["open_loop"]["latency_p50_ms"] for f in figures], "o-", color=color, label=f"{label}, p50")
        lat.plot(
            xs,
            [f["open_loop"]["latency_p95_ms"] for f in figures],
            "^--",
            color=color,
            alpha=0.7,
            label=f"{label}, p95",
        )
        for x, f in zip(xs, figures):  # overloaded: say how many chunks per second each robot got
            if f["open_loop"]["overloaded"]:
                o = f["open_loop"]
                lat.annotate(
                    f"{o['chunks_per_robot_per_s']:.2g}/s/robot",
                    (x, o["latency_p50_ms"]),
                    textcoords="offset points",
                    xytext=(5, 6 if name == "ours" else -11),
                    fontsize=7,
                    color=color,
                )
    tp.set(title="Aggregate action chunks per second (closed loop)", xlabel="robots", ylabel="chunks / s")
    hz = report["workload"]["observation_hz"]
    policy = report["workload"].get("frame_policy", "newest").split(":")[0]
    rule = "newest frame, or the next if nearer" if policy == "fresh" else "newest frame wins"
    lat.set(
        title=f"Sensor-to-action latency, {hz:g} Hz per robot\n({rule})", xlabel="robots", ylabel="ms", yscale="log"
    )
    tp.set_ylim(bottom=0)
    for ax in (tp, lat):
        ax.set_xticks(xs)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    m = report["model"]
    note = ", random weights" if m.get("random_weights") else ""
    fig.suptitle(
        f"pi0.5 ({m.get('preset') or 'checkpoint'}, {m['dtype']}{note}) on mstar_ros vs the model called directly"
    )
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_level(n: int, level: dict) -> None:
    bare = level["baseline"]["bare_forward_p50_ms"]
    print(
        f"\n{n} robot(s): throughput ratio {level['throughput_ratio']:.2f}x, "
        f"latency p50 ratio {level['latency_p50_ratio']:.2f} (bare forward p50 {bare:.0f} ms)"
    )
    print(f"  {'system':<10}{'chunks/s':>10}{'lat p50 ms':>12}{'lat p95 ms':>12}{'served Hz':>11}{'dropped':>9}")
    for name in ("ours", "baseline"):
        c, o = level[name]["closed_loop"], level[name]["open_loop"]
        print(
            f"  {name:<10}{c['chunks_per_s']:>10.3f}{o['latency_p50_ms']:>12.0f}{o['latency_p95_ms']:>12.0f}"
            f"{o['served_hz']:>11.2f}{o['dropped_fraction']:>9.0%}"
        )
