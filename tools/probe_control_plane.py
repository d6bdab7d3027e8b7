"""Probe (issue 28, point 13): what announced frames and silent peers cost the Conductor <-> Worker control plane.

    python tools/probe_control_plane.py [--connections 300] [--hello-timeout 2] [--wait 3] [--json out.json]

Cases, each against the real code on 127.0.0.1 (run it in a loopback-only namespace):

- worker-announced-1gib: the probe plays a Conductor that holds the pool token. A real
  Worker process (``python -m mstar.worker.process_main``) connects and passes the
  handshake; instead of its Setup the probe announces a frame of 1 GiB - 1 byte and sends
  no body. Reported: the Worker's RSS growth over the next ``--wait`` seconds.
- worker-announced-over-limit: the same with a frame over the protocol's limit (4 GiB - 1):
  how long the Worker takes to refuse it and exit, and its exit status.
- conductor-announced-1gib: the probe plays a Worker with the token against a real
  WorkerPool and announces a 1 GiB - 1 byte reply instead of Ready: the RSS growth of
  this process, which holds the pool.
- silent-connections: ``--connections`` connections to a real WorkerPool's control
  address that never say Hello (the pool's ``hello_timeout_s`` is ``--hello-timeout``).
  Reported: seconds until the pool has closed them all, the WARNING lines its logger
  wrote (and how many gave no reason), and those lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

TOKEN = "probe-pool-token-0123456789"
ONE_GIB_LESS_ONE = (1 << 30) - 1
OVER_LIMIT = (1 << 32) - 1
PLACEMENT = "world_size: 1\nnode_groups:\n  - {nodes: [llm, snac], ranks: [0]}\n"


def rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _recv_frame(sock: socket.socket):
    from mstar.worker.protocol import HEADER_SIZE, decode_body, frame_length

    data = b""
    while len(data) < HEADER_SIZE or len(data) < HEADER_SIZE + frame_length(data[:HEADER_SIZE]):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the Worker closed the connection during the handshake")
        data += chunk
    return decode_body(data[HEADER_SIZE:])


def worker_announces(length: int, wait_s: float) -> dict:
    """A real Worker passes the handshake with us; we announce ``length`` bytes and send none."""
    from mstar.worker import handshake
    from mstar.worker.protocol import TOKEN_ENV, Welcome, encode_frame

    listener = socket.create_server(("127.0.0.1", 0))
    env = {**os.environ, TOKEN_ENV: TOKEN, "OMP_NUM_THREADS": "1"}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mstar.worker.process_main",
            "--conductor",
            f"127.0.0.1:{listener.getsockname()[1]}",
            "--rank",
            "0",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        listener.settimeout(60)
        conn, _ = listener.accept()
        challenge = handshake.challenge()
        conn.sendall(encode_frame(challenge))
        hello = _recv_frame(conn)
        if not handshake.hello_is_valid(TOKEN, challenge, hello):
            raise RuntimeError("the Worker's Hello did not prove the token")
        baseline = rss_kb(worker.pid)
        conn.sendall(
            encode_frame(Welcome(handshake.welcome(TOKEN, challenge, hello).proof)) + length.to_bytes(4, "big")
        )
        start, peak, exited_s = time.monotonic(), baseline, None
        while time.monotonic() - start < wait_s:
            if worker.poll() is not None:
                exited_s = time.monotonic() - start
                break
            try:
                peak = max(peak, rss_kb(worker.pid))
            except (OSError, RuntimeError):
                pass
            time.sleep(0.02)
        conn.close()
        try:
            worker.wait(10)  # it exits once its Conductor is gone
        except subprocess.TimeoutExpired:
            pass
    finally:
        if worker.poll() is None:
            worker.kill()
        stderr = worker.communicate(timeout=30)[1]
        listener.close()
    return {
        "announced_bytes": length,
        "rss_growth_mb": round((peak - baseline) / 1024, 1),
        "exited_after_s": None if exited_s is None else round(exited_s, 3),
        "exit_status": worker.returncode,
        "stderr": stderr.strip().splitlines()[-1] if stderr.strip() else "",
    }


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _with_pool(hello_timeout_s: float, body):
    from mstar.conductor.worker_pool import WorkerPool
    from mstar.engine.config import EngineConfig
    from mstar.placement import PlacementFile, ResolvedPlacement
    from mstar.worker.protocol import TOKEN_ENV, ModelSpec
    from mstar_graphs.orpheus.graph import orpheus_graph

    os.environ[TOKEN_ENV] = TOKEN
    placement = ResolvedPlacement(orpheus_graph(), PlacementFile.parse(PLACEMENT, "probe.yaml"))
    pool = WorkerPool(
        ModelSpec("orpheus"), placement, EngineConfig(), launch=False, hello_timeout_s=hello_timeout_s, heartbeat_s=0
    )
    await pool.listen()  # no Worker is started: the probe speaks on their side
    try:
        return await body(pool)
    finally:
        await pool.stop()


async def _read_one_frame(reader: asyncio.StreamReader):
    from mstar.worker.protocol import HEADER_SIZE, decode_body, frame_length

    return decode_body(await reader.readexactly(frame_length(await reader.readexactly(HEADER_SIZE))))


def conductor_announced(wait_s: float) -> dict:
    from mstar.worker import handshake
    from mstar.worker.protocol import encode_frame

    async def body(pool) -> dict:
        reader, writer = await asyncio.open_connection(pool.host, pool.port)
        challenge = await _read_one_frame(reader)
        writer.write(encode_frame(handshake.hello(TOKEN, challenge, 0, os.getpid(), "probe")))
        await _read_one_frame(reader)  # Welcome
        await _read_one_frame(reader)  # Setup
        baseline = peak = rss_kb()
        writer.write(ONE_GIB_LESS_ONE.to_bytes(4, "big"))
        start = time.monotonic()
        while time.monotonic() - start < wait_s:
            await asyncio.sleep(0.05)
            peak = max(peak, rss_kb())
        writer.close()
        await asyncio.sleep(0.5)  # the pool sees the end before it stops
        return {"announced_bytes": ONE_GIB_LESS_ONE, "rss_growth_mb": round((peak - baseline) / 1024, 1)}

    return asyncio.run(_with_pool(30.0, body))


def silent_connections(count: int, hello_timeout_s: float) -> dict:
    handler = _Lines()
    logger = logging.getLogger("mstar.conductor.workers")
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # counted here, not printed

    async def until_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.read(65536):  # the Challenge, then EOF once the pool gives up on us
                pass
        except ConnectionError:
            pass
        writer.close()

    async def body(pool) -> dict:
        start = time.monotonic()
        waits = []
        for _ in range(count):  # one at a time: a full accept queue would drop some, and they would never end
            waits.append(asyncio.ensure_future(until_closed(*await asyncio.open_connection(pool.host, pool.port))))
        await asyncio.wait_for(asyncio.gather(*waits), hello_timeout_s + 60.0)
        closed_s = time.monotonic() - start
        await asyncio.sleep(hello_timeout_s + 6.0)  # room for a throttled summary to come out
        return {"connections": count, "all_closed_after_s": round(closed_s, 2)}

    try:
        result = asyncio.run(_with_pool(hello_timeout_s, body))
    finally:
        logger.removeHandler(handler)
    empty = sum(1 for line in handler.lines if line.rstrip().endswith(":"))
    return {
        **result,
        "warning_lines": len(handler.lines),
        "lines_without_a_reason": empty,
        "first_lines": handler.lines[:3],
        "last_line": handler.lines[-1] if handler.lines else "",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=300, help="silent connections to open (default 300)")
    p.add_argument("--hello-timeout", type=float, default=2.0, help="the pool's hello_timeout_s (default 2)")
    p.add_argument("--wait", type=float, default=3.0, help="seconds to watch RSS after an announcement (default 3)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)  # quiet: the silent case counts the pool's lines itself
    results = {
        "worker-announced-1gib": worker_announces(ONE_GIB_LESS_ONE, args.wait),
        "worker-announced-over-limit": worker_announces(OVER_LIMIT, max(args.wait, 10.0)),
        "conductor-announced-1gib": conductor_announced(args.wait),
        "silent-connections": silent_connections(args.connections, args.hello_timeout),
    }
    for name, result in results.items():
        print(f"{name}: {json.dumps(result)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
