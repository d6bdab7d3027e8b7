"""A Worker process: ``MSTAR_WORKER_TOKEN=T python -m mstar.worker.process_main --conductor HOST:PORT --rank N``.

Started by the Conductor for each rank of a placement, or by hand on another host
(same arguments, ``--listen`` its own address, and the pool's token in the
environment: it is kept out of argv, which every local user can read). It connects, says Hello,
builds what Setup asks for, answers Ready and then serves node messages until the
Conductor says Shutdown or its connection goes away (so a Conductor that dies
leaves no Worker behind).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

import msgspec

from mstar.worker.messages import CloseSession, ExecuteNode, ExportKV, KVExported, NodeOutput, ReleaseRequest
from mstar.worker.protocol import (TOKEN_ENV, BlockingChannel, FrameTooLarge, Hello, Ready, Setup, SetupFailed,
                                   Shutdown, StatsRequest, WorkerStats, worker_tag)

log = logging.getLogger("mstar.worker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mstar.worker.process_main",
                                     description="Run one mstar Worker process and connect it to a Conductor.")
    parser.add_argument("--conductor", required=True, help="the Conductor's control address, HOST:PORT")
    parser.add_argument("--rank", type=int, required=True, help="this Worker's rank in the placement file")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"the Conductor's worker token (default: ${TOKEN_ENV}, which is safer than argv)")
    parser.add_argument("--listen", help="address this Worker's tensor servers bind and advertise (default: the one "
                                         "the Conductor gives, fine on one host; on another host, its own address)")
    parser.add_argument("--log-level", default=os.environ.get("MSTAR_LOG_LEVEL", "WARNING"))
    return parser.parse_args(argv)


def _replier(channel: BlockingChannel):
    """Sends a call's replies; one too large for a frame fails that call, not the connection."""
    def send(out) -> None:
        try:
            channel.send(out)
        except FrameTooLarge as exc:
            if isinstance(out, NodeOutput):
                channel.send(NodeOutput(out.call_id, out.request_id, out.iteration, final=True, error=str(exc)))
            else:
                channel.send(KVExported(out.call_id, out.request_id, error=str(exc)))
    return send


def serve(channel: BlockingChannel, host) -> None:
    worker = host.worker
    reply = _replier(channel)
    while True:
        msg = channel.recv()
        if msg is None or isinstance(msg, Shutdown):
            return
        if isinstance(msg, ExecuteNode):
            worker.execute(msg, reply)
        elif isinstance(msg, (ReleaseRequest, CloseSession)):
            worker.handle(msg)
        elif isinstance(msg, ExportKV):
            worker.export_kv(msg, reply)
        elif isinstance(msg, StatsRequest):
            channel.send(WorkerStats(msg.seq, worker.stats(), worker.kv_blocks_used(), len(host.exchange)))
        else:
            log.warning("ignoring an unexpected %s", type(msg).__name__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (also sent when the Conductor's process dies) unwinds through the cleanup below;
    # Ctrl-C in a terminal reaches the whole process group: the Conductor decides when Workers stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not args.token:
        print(f"no worker token: set {TOKEN_ENV} (or --token)", file=sys.stderr)
        return 2
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
        if args.listen:
            setup = msgspec.structs.replace(setup, host=args.listen)
        host = WorkerHost(setup, args.rank, worker_tag(args.token, args.rank, os.getpid()), secret=args.token.encode())
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
        # SIGTERM and EOF often come together (the Conductor died): a second SIGTERM must not
        # cut the cleanup short and leave shared memory behind
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        host.close()
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
