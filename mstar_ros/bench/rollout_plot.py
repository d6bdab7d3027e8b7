"""PNG plot of ``bench rollout``: speedup vs horizon against the token-count bound, and planning."""

from __future__ import annotations

from pathlib import Path

from mstar_ros.bench.machine import layout_with_caption


def plot_rollout(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rollouts"]
    hs = [r["horizon"] for r in rows]
    fig, (sp, pl) = plt.subplots(1, 2, figsize=(11, 4))
    sp.plot(hs, [r["speedup"] for r in rows], "o-", label="measured (native / persistent KV)")
    sp.plot(hs, [r["token_bound"] for r in rows], "s--", label="token-count bound")
    goals = [(r["horizon"], r["goal"]) for r in rows if r["goal"] is not None]
    if goals:
        sp.plot(*zip(*goals), "k^", label="goal")
    sp.set(title="Rollout speedup over Meta's native recompute", xlabel="horizon (frames)", ylabel="x")
    sp.set_xticks(hs)
    plans = report["plans"]
    if plans:
        xs = range(len(plans))
        pl.bar([x - 0.2 for x in xs], [p["ours_ms_per_action"] for p in plans], 0.4, label="ours")
        pl.bar([x + 0.2 for x in xs], [p["native_ms_per_action"] for p in plans], 0.4, label="native")
        pl.set_xticks(list(xs), [f"{p['sessions']} session(s)" for p in plans])
        pl.set(title="CEM planning time per action", ylabel="ms")
    for ax in (sp, pl):
        ax.grid(alpha=0.3)
        ax.legend()
    note = " (random weights)" if report["model"].get("random_weights") else ""
    fig.suptitle(f"V-JEPA 2-AC on mstar_ros{note}")
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
