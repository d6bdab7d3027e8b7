"""The PNG of ``mstar-ros bench webrtc``: time to first audio by path, the gateway's overhead, underruns vs RTF."""

from __future__ import annotations

from pathlib import Path

from mstar_ros.bench.machine import layout_with_caption


def plot_webrtc(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted(report["levels"], key=int)
    xs = [int(n) for n in levels]
    lv = [report["levels"][n] for n in levels]
    fig, (ttfa, over, under) = plt.subplots(1, 3, figsize=(15, 4))
    for key, label, style in (
        ("ttfa_peer_ms", "at the peer (WebRTC)", "o-"),
        ("ttfa_in_process_ms", "in process (Conductor)", "s--"),
        ("whole_file_with_peers_ms", "/v1/audio/speech, whole file (peers connected)", "^:"),
        ("whole_file_ms", "/v1/audio/speech, whole file (no peers)", "v:"),
    ):
        ttfa.plot(xs, [x[key]["p50"] for x in lv], style, label=f"{label} p50")
    ttfa.set(title="Time to first audio", xlabel="peers", ylabel="ms", yscale="log")
    over.plot(xs, [x["ttfa_overhead_ms"]["p50"] for x in lv], "o-", label="p50")
    over.plot(xs, [x["ttfa_overhead_ms"]["p95"] for x in lv], "s-", label="p95")
    over.axhline(report["goals"]["ttfa_overhead_p95_ms"], color="red", ls="--", label="goal (p95)")
    over.set(title="Gateway overhead (peer - in process)", xlabel="peers", ylabel="ms")
    under.bar([x - 0.2 for x in range(len(xs))], [x["underruns"] for x in lv], width=0.4, label="underruns (frames)")
    rtf = under.twinx()
    rtf.plot(range(len(xs)), [x["rtf_max"] for x in lv], "ko-", label="RTF (max)")
    rtf.axhline(1.0, color="gray", ls=":")
    rtf.set_ylabel("RTF")
    under.set_xticks(range(len(xs)), [str(x) for x in xs])
    under.set(title="Underruns and RTF", xlabel="peers", ylabel="silent frames mid-utterance")
    for ax in (ttfa, over):
        ax.set_xticks(xs)
    for ax in (ttfa, over, under):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    note = " (random weights)" if report["model"].get("random_weights") else ""
    fig.suptitle(f"Voice gateway: {report['model']['name']} to aiortc peers on loopback{note}")
    layout_with_caption(fig, report)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
