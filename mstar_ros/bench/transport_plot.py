"""PNG plot of the transport benchmark (matplotlib, headless), in the style of plot.py."""

from __future__ import annotations

from pathlib import Path


def plot_transport(section: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = section["sizes"]
    xs = [s / 1024 for s in sizes]
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(11, 4))
    series = [("memcpy (in-process limit)", section["memcpy"], "k--")]
    styles = {"shm": "o-", "tcp": "s-", "mooncake": "^-", "inline": "v-"}
    series += [(kind, table, styles.get(kind, "x-")) for kind, table in section["transports"].items()]
    for name, table, style in series:
        lat.plot(xs, [table[str(s)]["latency_us_p50"] for s in sizes], style, label=name)
        bw.plot(xs, [table[str(s)]["bandwidth_gbps"] for s in sizes], style, label=name)
    lat.set(title="One-way latency, p50", xlabel="tensor size (KiB)", ylabel="us", xscale="log", yscale="log")
    bw.set(title="Bandwidth", xlabel="tensor size (KiB)", ylabel="GB/s", xscale="log", yscale="log")
    for ax in (lat, bw):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    env = section["environment"]
    fig.suptitle(f"Tensor transports between two processes ({env['cpus']} CPUs, torch {env['torch']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
