"""``mstar-ros bench webrtc``: the voice gateway with 1..N aiortc peers on loopback.

At each level N, N peers (aiortc, in a process of their own: mstar_ros.bench.webrtc_peers) connect
to one gateway (one Conductor) and, for ``rounds`` rounds, all ask for a response at once. Per
response, on one clock (time.monotonic() is the host's, whichever process reads it):

- time to first audio at the peer: ``response.create`` sent on the data channel -> the first audible
  20 ms frame out of the peer's Opus decoder;
- the same request's time to first audio in process: the event off the data channel -> the graph's
  first audio chunk out of the Conductor; the difference is the gateway's overhead (data channel in,
  resampling, clocked 20 ms frames, Opus, RTP over loopback, the peer's jitter buffer and decoder);
- underruns: silent frames the gateway sent mid-utterance because the model fell behind, next to the
  response's RTF (generation time / audio time);
- jitter: the peers' inbound-rtp jitter (RTCP statistics of aiortc's receiver).

Then the same requests, N at once, through ``POST /v1/audio/speech`` read as a whole file: time to
the last byte, the first moment a client that does not stream has any audio to play. It is timed twice:
with the level's N peers still connected and idle (the gateway keeps sending them silence, the load the
peers' own requests started under: ``ttfa_ratio_stream_vs_file`` compares with this one), and with no
peer connected (``..._no_peers``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mstar.engine.dtype_choice import resolve_dtype
from mstar.progress import progress_bar
from mstar_ros.bench.machine import dtypes_section, header_line, machine_section
from mstar_ros.bench.webrtc_peers import JITTER_PREFETCH, TEXTS
from mstar_ros.bench.workload import percentile

log = logging.getLogger("mstar_ros.bench")
GOALS = {"ttfa_overhead_p95_ms": 60.0, "underruns_where_rtf_below_1": 0, "ttfa_ratio_stream_vs_file": 0.2}


@dataclass
class WebrtcBenchOptions:
    peers: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    rounds: int = 3
    max_tokens: int = 280  # 40 SNAC frames: ~3.4 s of audio per response
    model: str = "orpheus"
    weights: Path | None = None
    preset: str = "bench"
    seed: int = 0
    dtype: str = "auto"  # the fastest this machine runs natively (mstar.engine.dtype_choice)
    placement: Path | None = None  # the model in Worker processes (off the gateway's interpreter)


@dataclass
class PeerResponse:
    ttfa_peer_ms: float
    ttfa_model_ms: float
    rtf: float
    underruns: int
    audio_s: float

    @property
    def overhead_ms(self) -> float:
        return self.ttfa_peer_ms - self.ttfa_model_ms


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "max": round(max(values), 1) if values else float("nan"),
    }


async def _peers_level(model, conductor, n: int, opts: WebrtcBenchOptions, bar) -> dict:
    from mstar_ros.webrtc.server import GatewayLimits, VoiceGateway, serve_on_free_port

    gateway = VoiceGateway(model, conductor, limits=GatewayLimits(max_peers=max(8, n)), model_name=opts.model)
    runner, url = await serve_on_free_port(gateway)
    peers_by_id = {}
    responses: list[PeerResponse] = []
    jitter: list[float] = []
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mstar_ros.bench.webrtc_peers",
        url,
        str(n),
        str(opts.rounds),
        str(opts.max_tokens),
        str(opts.seed),
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE,
    )
    loaded_file: dict = {}
    try:
        async for line in proc.stdout:  # type: ignore[union-attr]
            row = json.loads(line)
            if "connected" in row:
                peers_by_id = {pc_id: gateway.peers[pc_id] for pc_id in row["connected"]}
            elif "jitter_ms" in row:
                jitter = row["jitter_ms"]
            elif "idle" in row:  # the whole file at the load the peers' responses saw: them connected, idle
                loaded_file = await _whole_file_level(url, n, opts)
                proc.stdin.write(b"bye\n")  # type: ignore[union-attr]
                await proc.stdin.drain()  # type: ignore[union-attr]
            else:
                timing = peers_by_id[row["pc_id"]].timings[row["round"]]
                if timing.status != "completed" or row["heard"] is None or timing.rtf is None:
                    raise RuntimeError(f"a response did not complete ({timing.status}) or was not heard")
                responses.append(
                    PeerResponse(
                        (row["heard"] - row["sent"]) * 1000,
                        timing.model_ttfa_ms,
                        timing.rtf,
                        timing.underruns,
                        timing.audio_s,
                    )
                )
                if len(responses) % n == 0:
                    bar.update(1)
        if await proc.wait() != 0 or len(responses) != n * opts.rounds:
            raise RuntimeError(
                f"the peers' process failed (exit {proc.returncode}, {len(responses)} of {n * opts.rounds} responses)"
            )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await runner.cleanup()
    rtf_max = max(r.rtf for r in responses)
    return {
        "responses": len(responses),
        "ttfa_peer_ms": _stats([r.ttfa_peer_ms for r in responses]),
        "ttfa_in_process_ms": _stats([r.ttfa_model_ms for r in responses]),
        "ttfa_overhead_ms": _stats([r.overhead_ms for r in responses]),
        "rtf_p50": round(percentile([r.rtf for r in responses], 50), 3),
        "rtf_max": round(rtf_max, 3),
        "underruns": sum(r.underruns for r in responses),
        "underrun_ms": sum(r.underruns for r in responses) * 20,
        # per response: one that the model made faster than real time must have had no gap
        "responses_below_rtf_1": sum(r.rtf < 1 for r in responses),
        "underruns_in_responses_below_rtf_1": sum(r.underruns for r in responses if r.rtf < 1),
        "audio_s_per_response": round(sum(r.audio_s for r in responses) / len(responses), 3),
        "jitter_ms_max": round(max(jitter), 2),
        "whole_file_with_peers_ms": loaded_file["whole_file_ms"],
    }


async def _whole_file_level(conductor_url: str, n: int, opts: WebrtcBenchOptions) -> dict:
    from aiohttp import ClientSession

    async def one(http, i: int) -> tuple[float, int]:
        t = time.monotonic()
        body = {
            "input": TEXTS[i % len(TEXTS)],
            "response_format": "wav",
            "seed": opts.seed + i,
            "max_tokens": opts.max_tokens,
        }
        async with http.post(f"{conductor_url}/v1/audio/speech", json=body) as r:
            data = await r.read()
            if r.status != 200:
                raise RuntimeError(f"/v1/audio/speech answered {r.status}: {data[:200]!r}")
        return (time.monotonic() - t) * 1000, len(data)

    times = []
    async with ClientSession() as http:
        for _ in range(opts.rounds):
            times += [t for t, _ in await asyncio.gather(*(one(http, i) for i in range(n)))]
    return {"whole_file_ms": _stats(times)}


async def _bench(model, opts: WebrtcBenchOptions) -> dict:
    from mstar.engine.config import EngineConfig
    from mstar_ros.webrtc.server import VoiceGateway, serve_on_free_port
    from mstar_ros.webrtc.speech_models import speech_conductor

    levels: dict[str, dict] = {}
    bar = progress_bar(total=len(opts.peers) * opts.rounds, desc="bench webrtc", unit="round")
    config = EngineConfig(dtype=opts.dtype)
    async with speech_conductor(model, config, opts.placement) as conductor:
        warm = conductor.submit(model.request("Warm up.", sampling=None))
        await warm.collect()
        for n in opts.peers:
            bar.set_postfix(peers=n)
            level = await _peers_level(model, conductor, n, opts, bar)
            runner, url = await serve_on_free_port(VoiceGateway(model, conductor, model_name=opts.model))
            try:
                level.update(await _whole_file_level(url, n, opts))
            finally:
                await runner.cleanup()
            peer = level["ttfa_peer_ms"]["p50"]
            level["ttfa_ratio_stream_vs_file"] = round(peer / level["whole_file_with_peers_ms"]["p50"], 4)
            level["ttfa_ratio_stream_vs_file_no_peers"] = round(peer / level["whole_file_ms"]["p50"], 4)
            levels[str(n)] = level
            log.info("%d peers: %s", n, level)
    bar.close()
    return levels


def run_webrtc_bench(opts: WebrtcBenchOptions) -> dict:
    from mstar_ros.webrtc.speech_models import load_speech_model

    kwargs = {"preset": opts.preset} if opts.weights is None else {}
    if opts.placement is not None:  # the Worker processes load the weights; this process builds requests
        kwargs["requests_only"] = True
    model = load_speech_model(opts.model, str(opts.weights) if opts.weights else None, **kwargs)
    levels = asyncio.run(_bench(model, opts))
    top = str(max(opts.peers))
    slow_levels = [n for n, lv in levels.items() if lv["rtf_max"] >= 1]
    report = {
        "model": {
            "name": opts.model,
            "preset": opts.preset if opts.weights is None else None,
            "weights": str(opts.weights) if opts.weights else None,
            "random_weights": bool(getattr(model, "random_weights", False)),
        },
        "options": {
            "peers": opts.peers,
            "rounds": opts.rounds,
            "max_tokens": opts.max_tokens,
            "seed": opts.seed,
            "dtype": resolve_dtype(opts.dtype).dtype,
            "jitter_prefetch_frames": JITTER_PREFETCH,
            "placement": str(opts.placement) if opts.placement else None,
        },
        "machine": machine_section(),
        "dtypes": dtypes_section(resolve_dtype(opts.dtype), None, ""),
        "levels": levels,
        f"ttfa_overhead_p95_ms_{top}_peers": levels[top]["ttfa_overhead_ms"]["p95"],
        "underruns_where_rtf_below_1": sum(lv["underruns"] for n, lv in levels.items() if n not in slow_levels),
        "responses_below_rtf_1": sum(lv["responses_below_rtf_1"] for lv in levels.values()),
        "underruns_in_responses_below_rtf_1": sum(lv["underruns_in_responses_below_rtf_1"] for lv in levels.values()),
        "levels_with_rtf_at_or_above_1": slow_levels,
        "ttfa_ratio_stream_vs_file": max(lv["ttfa_ratio_stream_vs_file"] for lv in levels.values()),
        "ttfa_ratio_stream_vs_file_no_peers": max(lv["ttfa_ratio_stream_vs_file_no_peers"] for lv in levels.values()),
        "goals": GOALS,
    }
    return report


def summary_lines(report: dict) -> list[str]:
    top = max(int(n) for n in report["levels"])
    lines = [
        header_line(report),
        f"{'peers':>5} {'ttfa peer p50/p95':>18} {'in-process p50/p95':>19} {'overhead p50/p95':>17} "
        f"{'file p50 (peers on / none)':>27} {'ratio on / none':>15} {'rtf max':>7} {'underruns':>9} {'jitter':>7}",
    ]
    for n, lv in sorted(report["levels"].items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"{n:>5} {lv['ttfa_peer_ms']['p50']:>8.0f}/{lv['ttfa_peer_ms']['p95']:<6.0f}ms "
            f"{lv['ttfa_in_process_ms']['p50']:>9.0f}/{lv['ttfa_in_process_ms']['p95']:<6.0f}ms "
            f"{lv['ttfa_overhead_ms']['p50']:>7.0f}/{lv['ttfa_overhead_ms']['p95']:<6.0f}ms "
            f"{lv['whole_file_with_peers_ms']['p50']:>14.0f} / {lv['whole_file_ms']['p50']:<7.0f}ms "
            f"{lv['ttfa_ratio_stream_vs_file']:>6.3f} / {lv['ttfa_ratio_stream_vs_file_no_peers']:<6.3f} "
            f"{lv['rtf_max']:>7.3f} {lv['underruns']:>9d} {lv['jitter_ms_max']:>5.1f}ms"
        )
    overhead = report[f"ttfa_overhead_p95_ms_{top}_peers"]
    goals = report["goals"]
    lines.append(
        f"gateway overhead p95 at {top} peers: {overhead:.0f} ms (goal <= {goals['ttfa_overhead_p95_ms']:g}): "
        f"{'met' if overhead <= goals['ttfa_overhead_p95_ms'] else 'NOT met'}"
    )
    below, gaps = report["responses_below_rtf_1"], report["underruns_in_responses_below_rtf_1"]
    lines.append(
        f"underruns in the {below} responses made at RTF < 1: {gaps} (goal 0): "
        f"{'met' if gaps == 0 and below else 'not exercised (no response at RTF < 1)' if not below else 'NOT met'}"
    )
    under = report["underruns_where_rtf_below_1"]
    lines.append(
        f"underruns where RTF < 1: {under} (goal 0): {'met' if under == 0 else 'NOT met'}"
        + (
            f"; levels at RTF >= 1: {', '.join(report['levels_with_rtf_at_or_above_1'])}"
            if report["levels_with_rtf_at_or_above_1"]
            else ""
        )
    )
    ratio = report["ttfa_ratio_stream_vs_file"]
    lines.append(
        f"streamed time to first audio / whole file at the same load, worst level: {ratio:.3f} (goal <= "
        f"{goals['ttfa_ratio_stream_vs_file']:g}): {'met' if ratio <= goals['ttfa_ratio_stream_vs_file'] else 'NOT met'}"
    )
    alone = report["ttfa_ratio_stream_vs_file_no_peers"]
    lines.append(
        f"  (against the whole file with no peer connected: {alone:.3f}, "
        f"{'met' if alone <= goals['ttfa_ratio_stream_vs_file'] else 'NOT met'})"
    )
    return lines
