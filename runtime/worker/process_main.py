"""A Worker process: ``python -m mstar.worker.process_main --conductor HOST:PORT --rank N --token T``.

Started by the Conductor for each rank of a placement, or by hand on another host
(same arguments; the token is printed by the Conductor). It connects, says Hello,
builds what Setup asks for, answers Ready and then serves node messages until the
Conductor says Shutdown or its connection goes away (so a Conductor that dies
leaves no Worker behind).
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from mstar.worker.messages import CloseSession, ExecuteNode, ExportKV, ReleaseRequest
from mstar.worker.protocol import (BlockingChannel, Hello, Ready, Setup, SetupFailed, Shutdown, StatsRequest,
                                   WorkerStats)

log = logging.getLogger("mstar.worker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mstar.worker.process_main",
                                     description="Run one mstar Worker process and connect it to a Conductor.")
    parser.add_argument("--conductor", required=True, help="the Conductor's control address, HOST:PORT")
    parser.add_argument("--rank", type=int, required=True, help="this Worker's rank in the placement file")
    parser.add_argument("--token", required=True, help="the Conductor's worker token (it logs it at start)")
    parser.add_argument("--log-level", default=os.environ.get("MSTAR_LOG_LEVEL", "WARNING"))
    return parser.parse_args(argv)


def serve(channel: BlockingChannel, host) -> None:
    worker = host.worker
    while True:
        msg = channel.recv()
        if msg is None or isinstance(msg, Shutdown):
            return
        if isinstance(msg, ExecuteNode):
            worker.execute(msg, channel.send)
        elif isinstance(msg, (ReleaseRequest, CloseSession)):
            worker.handle(msg)
        elif isinstance(msg, ExportKV):
            worker.export_kv(msg, channel.send)
        elif isinstance(msg, StatsRequest):
            channel.send(WorkerStats(msg.seq, worker.stats(), worker.kv_blocks_used(), len(host.exchange)))
        else:
            log.warning("ignoring an unexpected %s", type(msg).__name__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"[worker {args.rank}] %(levelname)s %(name)s: %(message)s")
    address, _, port = args.conductor.rpartition(":")
    sock = socket.create_connection((address, int(port)), timeout=30)
    sock.settimeout(None)
    channel = BlockingChannel(sock)
    channel.send(Hello(args.rank, os.getpid(), socket.gethostname(), args.token))
    setup = channel.recv()
    if not isinstance(setup, Setup):
        log.error("the conductor did not send Setup (got %s)", type(setup).__name__)
        return 2
    try:
        from mstar.worker.host import WorkerHost
        host = WorkerHost(setup, args.rank, f"{args.token}r{args.rank}p{os.getpid()}")
    except Exception as exc:
        log.exception("setup failed")
        channel.send(SetupFailed(f"{type(exc).__name__}: {exc}"))
        return 1
    try:
        channel.send(Ready(host.exchange.endpoints(), host.segment_prefix))
        serve(channel, host)
    except (ConnectionError, OSError) as exc:
        log.warning("conductor connection lost: %s", exc)
    finally:
        host.close()
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
