"""``mstar-ros bench transport``: tensor transports between two real processes vs memcpy.

Method: the driver (this process) and a spawned peer each own a TensorExchange. Per
transport and size the driver puts a tensor, exports it, sends the handle over a plain
TCP control socket; the peer reads it into a preallocated tensor and answers with its
own exported tensor of the same size, which the driver reads likewise. One-way time
= round trip / 2, so it includes the producer's export copy, the handle's trip and the
consumer's read. Bandwidth = size / p50 one-way. The limit, in-process memcpy (the
faster of torch ``copy_`` and a plain memcpy into a preallocated tensor), is measured in
the same run, alternating with the transports in rounds at each size, since timings on
shared machines swing 2-4x within seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import secrets
import socket
import statistics
import time
from typing import Any

import torch
from tqdm import tqdm

from mstar.progress import progress_bar
from mstar.transport.codec import memcpy
from mstar.transport.exchange import TensorExchange
from mstar.transport.tcp import SECRET_ENV
from mstar_ros.bench.transport_peer import Channel, Ping, Ready, Setup, Stop, bench_tensor, peer_main, read_reply

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M"
# option -> (default, with --quick): the quick run still measures every transport, at a small and a
# larger size, and the Orpheus split
DEFAULTS = {
    "sizes": (DEFAULT_SIZES, "4K,1M"),
    "repeats": (50, 3),
    "orpheus_requests": (16, 2),
    "orpheus_preset": ("bench", "tiny"),
}
TRANSPORTS = ("inline", "shm", "tcp", "mooncake")
WARMUP = 3  # first reads attach segments, open connections, open Mooncake segments
ROUNDS = 3  # memcpy and the transports alternate this many times per size


def apply_defaults(args: argparse.Namespace) -> None:
    """Fills the options not given on the command line, from DEFAULTS (the quick column with --quick)."""
    for name, (default, quick) in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, quick if getattr(args, "quick", False) else default)


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    value = int(text[:-1] if scale > 1 else text) * scale
    if value <= 0 or value % 4:
        raise ValueError(f"--sizes: {text!r} must be a positive multiple of 4 bytes")
    return value


def size_label(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def extra_sections(args: argparse.Namespace) -> dict[str, Any]:
    """Orpheus at concurrency 8, one process vs LLM and SNAC in two Worker processes (same run)."""
    if getattr(args, "orpheus_requests", 0) <= 0:
        return {}
    import asyncio

    from mstar_ros.bench.orpheus_split import orpheus_split_comparison

    section = asyncio.run(
        orpheus_split_comparison(preset=args.orpheus_preset, concurrency=8, requests=args.orpheus_requests)
    )
    one, two = section["single_process"], section["two_processes"]
    print(f"\nOrpheus ({section['preset']}), concurrency 8, {section['requests']} requests:")
    print(f"  {'':<14}{'audio s/s':>10}{'TTFA p50 ms':>13}{'TTFA p95 ms':>13}")
    for label, row in (("one process", one), ("two processes", two)):
        print(
            f"  {label:<14}{row['throughput_audio_s_per_s']:>10.2f}{row['ttfa_p50_ms']:>13.0f}{row['ttfa_p95_ms']:>13.0f}"
        )
    print(
        f"  two / one: throughput {section['two_vs_single_throughput']:.2f}x, TTFA p50 {section['two_vs_single_ttfa_p50']:.2f}x"
    )
    return {"orpheus_split": section}


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def _figures(one_way_s: list[float], nbytes: int) -> dict[str, float]:
    p50 = statistics.median(one_way_s)
    return {
        "latency_us_p50": p50 * 1e6,
        "latency_us_p90": _p(one_way_s, 90) * 1e6,
        "bandwidth_gbps": nbytes / p50 / 1e9,
    }


def _memcpy_times(nbytes: int, repeats: int) -> dict[str, list[float]]:
    """The in-process limit, two ways: torch ``copy_`` and our memcpy, between preallocated tensors."""
    src, dst = bench_tensor(nbytes, 0), torch.empty(nbytes // 4)
    copies = {"torch_copy": lambda: dst.copy_(src), "memcpy": lambda: memcpy(dst.data_ptr(), src.data_ptr(), nbytes)}
    times: dict[str, list[float]] = {name: [] for name in copies}
    for name, copy in copies.items():
        for i in range(WARMUP + repeats):
            t0 = time.perf_counter()
            copy()
            if i >= WARMUP:
                times[name].append(time.perf_counter() - t0)
    return times


def _ping_pong_times(exchange: TensorExchange, channel: Channel, kind: str, nbytes: int, repeats: int) -> list[float]:
    channel.send(Setup(kind, nbytes))
    assert isinstance(channel.recv(), Ready)
    src, out = bench_tensor(nbytes, 0), torch.empty(nbytes // 4)
    times = []
    for i in range(WARMUP + repeats):
        owner = f"{kind}{nbytes}/{i}"
        t0 = time.perf_counter()
        channel.send(Ping(exchange.export(exchange.put(src, owner), kind)))
        reply = channel.recv()
        got = read_reply(exchange, reply.handle, kind, out)
        elapsed = time.perf_counter() - t0
        exchange.free_owner(owner)  # after the peer's reply: it has read ours
        if i >= WARMUP:
            times.append(elapsed / 2)
    if not torch.equal(got, bench_tensor(nbytes, 1)):  # the peer's tensor arrived intact
        raise RuntimeError(f"{kind} transport corrupted a {size_label(nbytes)} tensor")
    return times


def _measure_size(
    exchange: TensorExchange, channel: Channel, kinds: list[str], nbytes: int, repeats: int, bar: tqdm
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """memcpy and every transport in alternating rounds, so load swings on a shared host hit all alike."""
    per_round = -(-repeats // ROUNDS)
    times: dict[str, list[float]] = {name: [] for name in ("torch_copy", "memcpy", *kinds)}
    for _ in range(ROUNDS):
        bar.set_postfix_str(f"memcpy {size_label(nbytes)}")
        for name, samples in _memcpy_times(nbytes, per_round).items():
            times[name] += samples
        bar.update()
        for kind in kinds:
            bar.set_postfix_str(f"{kind} {size_label(nbytes)}")
            times[kind] += _ping_pong_times(exchange, channel, kind, nbytes, per_round)
            bar.update()
    candidates = {name: _figures(times[name], nbytes) for name in ("torch_copy", "memcpy")}
    limit = max(candidates.values(), key=lambda r: r["bandwidth_gbps"])  # the faster of the two is the limit
    limit = {
        **limit,
        "torch_copy_gbps": candidates["torch_copy"]["bandwidth_gbps"],
        "memcpy_gbps": candidates["memcpy"]["bandwidth_gbps"],
    }
    rows = {}
    for kind in kinds:
        rows[kind] = _figures(times[kind], nbytes)
        rows[kind]["vs_memcpy"] = rows[kind]["bandwidth_gbps"] / limit["bandwidth_gbps"]
    return limit, rows


def _start_peer(mooncake: bool, arena_mb: int, secret: bytes) -> tuple[multiprocessing.Process, Channel]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(120)  # the peer imports torch (and Mooncake) first
    ctx = multiprocessing.get_context("spawn")
    # the secret goes through the spawn pipe of this host's own child, never argv or a socket
    peer = ctx.Process(
        target=peer_main,
        name="transport-bench-peer",
        daemon=True,
        args=(server.getsockname()[1], f"benchpeer{os.getpid()}", mooncake, arena_mb, torch.get_num_threads(), secret),
    )
    peer.start()
    try:
        conn, _ = server.accept()
    finally:
        server.close()
    conn.settimeout(None)
    return peer, Channel(conn)


def run_transport_bench(args: argparse.Namespace) -> int:
    sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
    wanted = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = sorted(set(wanted) - set(TRANSPORTS))
    if unknown:
        raise ValueError(f"--transports: unknown {', '.join(unknown)} (choose from {', '.join(TRANSPORTS)})")
    skipped: dict[str, str] = {}
    if "mooncake" in wanted and importlib.util.find_spec("mooncake") is None:
        skipped["mooncake"] = "not installed (pip install -e '.[mooncake]')"
    kinds = [k for k in wanted if k not in skipped]
    arena_mb = -(-max(sizes) // (1 << 20)) + 1  # one tensor of the largest size in flight per process
    # both TCP ends must hold one secret before either exchange is made (a pool's token, in a real run)
    secret = (os.environ.get(SECRET_ENV) or secrets.token_hex(16)).encode()
    exchange = TensorExchange(
        f"bench{os.getpid()}",
        shm=True,
        tcp_host="127.0.0.1",
        mooncake_host="127.0.0.1" if "mooncake" in kinds else None,
        shm_arena_mb=arena_mb,
        secret=secret,
    )
    peer, channel = _start_peer("mooncake" in kinds, arena_mb, secret)
    limits: dict[str, dict[str, float]] = {}
    tables: dict[str, dict[str, dict[str, float]]] = {k: {} for k in kinds}
    try:
        with progress_bar(total=len(sizes) * ROUNDS * (len(kinds) + 1), desc="transport", unit="block") as bar:
            for nbytes in sizes:
                limits[str(nbytes)], rows = _measure_size(exchange, channel, kinds, nbytes, args.repeats, bar)
                for kind, row in rows.items():
                    tables[kind][str(nbytes)] = row
        channel.send(Stop())
    finally:
        peer.join(30)
        if peer.is_alive():
            peer.kill()
        channel.sock.close()
        exchange.close()
    section = _section(args, sizes, limits, tables, skipped)
    from mstar_ros.bench.machine import machine_section

    report = {"transport": section, "machine": machine_section(), **extra_sections(args)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    from mstar_ros.bench.transport_plot import plot_transport

    plot_transport(section, args.plot)
    print_tables(section)
    print(f"wrote {args.json} and {args.plot}")
    return 0


def _section(args: argparse.Namespace, sizes: list[int], limits: dict, tables: dict, skipped: dict) -> dict[str, Any]:
    shm = tables.get("shm", {})
    at64, at4 = str(64 << 20), str(4 << 10)
    return {
        "method": __doc__.split("Method: ", 1)[1].strip(),
        "environment": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "repeats": args.repeats,
        "sizes": sizes,
        "shm_vs_memcpy_64mb": shm[at64]["vs_memcpy"] if at64 in shm else None,
        "shm_latency_4kb_us": shm[at4]["latency_us_p50"] if at4 in shm else None,
        "memcpy": limits,
        "transports": tables,
        "skipped": skipped,
    }


def print_tables(section: dict[str, Any]) -> None:
    kinds = list(section["transports"])
    for title, field, fmt in (
        ("one-way latency p50, us", "latency_us_p50", "{:>12.1f}"),
        ("bandwidth, GB/s (x memcpy)", "bandwidth_gbps", "{:>12.2f}"),
    ):
        print(f"\n{title}")
        print(f"  {'size':>6}{'memcpy':>12}" + "".join(f"{k:>18}" for k in kinds))
        for nbytes in section["sizes"]:
            key = str(nbytes)
            line = f"  {size_label(nbytes):>6}" + fmt.format(section["memcpy"][key][field])
            for k in kinds:
                row = section["transports"][k][key]
                ratio = f" ({row['vs_memcpy']:.2f}x)" if field == "bandwidth_gbps" else "      "
                line += fmt.format(row[field]) + ratio
            print(line)
    print(
        f"\nshm vs memcpy at 64MB: {section['shm_vs_memcpy_64mb']}   "
        f"shm one-way latency at 4KB: {section['shm_latency_4kb_us']} us"
    )
    for kind, why in section["skipped"].items():
        print(f"skipped {kind}: {why}")
