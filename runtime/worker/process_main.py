"""A Worker process: ``MSTAR_WORKER_TOKEN=T python -m mstar.worker.process_main --conductor HOST:PORT --rank N``.

Started by the Conductor for each rank of a placement, or by hand on another host
(same arguments, ``--listen`` its own address, and the pool's token in the
environment: it is kept out of argv, which every local user can read). It connects,
proves it holds the token and checks that the Conductor does (``mstar.worker.handshake``),
builds what Setup asks for -- only models and plugins registered on this side
(``mstar.worker.registry``; ``--model NAME=module:function`` adds one) -- answers Ready and
then serves node messages until the Conductor says Shutdown or its connection goes away
(so a Conductor that dies leaves no Worker behind).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

import msgspec

from mstar.engine.messages import CloseSession, ExecuteNode, ExportKV, FeedInput, KVExported, NodeOutput, ReleaseRequest
from mstar.worker import handshake, registry
from mstar.worker.protocol import (
    MAX_HELLO,
    TOKEN_ENV,
    BlockingChannel,
    Challenge,
    FrameTooLarge,
    Ready,
    Setup,
    SetupFailed,
    Shutdown,
    StatsRequest,
    Welcome,
    WorkerStats,
    worker_tag,
)

log = logging.getLogger("mstar.worker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mstar.worker.process_main",
        description=f"Run one mstar Worker process and connect it to a Conductor. "
        f"The pool's token comes from ${TOKEN_ENV} (never argv).",
    )
    parser.add_argument("--conductor", required=True, help="the Conductor's control address, HOST:PORT")
    parser.add_argument("--rank", type=int, required=True, help="this Worker's rank in the placement file")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=MODULE:FUNCTION",
        help=f"register a model for this Worker only (repeatable; also ${registry.MODELS.env}); "
        f"installed graph packages register theirs as entry points ({registry.MODELS.group})",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="NAME=MODULE:FUNCTION",
        help=f"register a Worker plugin likewise (also ${registry.PLUGINS.env}; entry points {registry.PLUGINS.group})",
    )
    parser.add_argument(
        "--listen",
        help="address this Worker's tensor servers bind and advertise (default: the one "
        "the Conductor gives, fine on one host; on another host, its own address)",
    )
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
        elif isinstance(msg, (ReleaseRequest, CloseSession, FeedInput)):
            worker.handle(msg)
        elif isinstance(msg, ExportKV):
            worker.export_kv(msg, reply)
        elif isinstance(msg, StatsRequest):
            channel.send(WorkerStats(msg.seq, worker.stats(), worker.kv_blocks_used(), len(host.exchange)))
        else:
            log.warning("ignoring an unexpected %s", type(msg).__name__)


def _connect(conductor: str, token: str, rank: int) -> tuple[BlockingChannel, Setup]:
    """Connects, runs the handshake, returns the channel and the Setup; raises ConnectionError."""
    address, _, port = conductor.rpartition(":")
    try:
        sock = socket.create_connection((address, int(port)), timeout=30)
    except OSError as exc:
        raise ConnectionError(f"cannot reach the Conductor at {conductor}: {exc}") from None
    channel = BlockingChannel(sock)
    try:
        challenge = channel.recv(MAX_HELLO)  # nothing larger is read before the Conductor has proved itself
        if challenge is None:
            raise ConnectionError(f"the Conductor at {conductor} closed the connection before its challenge")
        if not isinstance(challenge, Challenge):
            raise ConnectionError(f"{conductor} is not an mstar Conductor (it sent {type(challenge).__name__})")
        hello = handshake.hello(token, challenge, rank, os.getpid(), socket.gethostname())
        channel.send(hello)
        welcome = channel.recv(MAX_HELLO)
        if welcome is None:
            raise ConnectionError(
                f"the Conductor at {conductor} refused this Worker: it does not hold the same "
                f"pool token (${TOKEN_ENV}), or rank {rank} is taken"
            )
        if not isinstance(welcome, Welcome) or not handshake.welcome_is_valid(token, challenge, hello, welcome):
            raise ConnectionError(
                f"the Conductor at {conductor} could not prove it holds the pool token: building nothing it asks for"
            )
        sock.settimeout(None)  # from here on the Conductor may take its time (other ranks set up)
        setup = channel.recv()
        if not isinstance(setup, Setup):
            raise ConnectionError(f"the Conductor did not send Setup (got {type(setup).__name__})")
        return channel, setup
    except ConnectionError:
        channel.close()
        raise
    except (msgspec.DecodeError, ValueError, OSError) as exc:  # a garbled or oversized frame, a timeout
        channel.close()
        raise ConnectionError(f"handshake with the Conductor at {conductor} failed: {exc}") from None
    except BaseException:
        channel.close()
        raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (also sent when the Conductor's process dies) unwinds through the cleanup below;
    # Ctrl-C in a terminal reaches the whole process group: the Conductor decides when Workers stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    token = os.environ.get(TOKEN_ENV)
    if not token:
        print(f"no worker token: set {TOKEN_ENV} to the Conductor's pool token", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"[worker {args.rank}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        for flag, kind, items in (
            ("--model", registry.MODELS, args.model),
            ("--plugin", registry.PLUGINS, args.plugin),
        ):
            for item in items:
                for name, target in registry.parse_registrations(kind, item, flag).items():
                    registry.register(kind, name, target)
        channel, setup = _connect(args.conductor, token, args.rank)
    except (ValueError, ConnectionError) as exc:
        print(f"mstar worker rank {args.rank}: error: {exc}", file=sys.stderr)
        return 2
    try:
        from mstar.worker.host import WorkerHost

        if args.listen:
            setup = msgspec.structs.replace(setup, host=args.listen)
        host = WorkerHost(setup, args.rank, worker_tag(token, args.rank, os.getpid()), secret=token.encode())
    except Exception as exc:
        # the Conductor reports it (one line); the traceback is for --log-level DEBUG
        log.debug("setup failed", exc_info=True)
        try:
            channel.send(SetupFailed(f"{type(exc).__name__}: {exc}"))
        except OSError:
            log.error("setup failed: %s: %s (and the Conductor is gone)", type(exc).__name__, exc)
        return 1
    try:
        choice = host.worker.dtype_choice
        channel.send(Ready(host.exchange.endpoints(), host.segment_prefix, choice.dtype, choice.describe()))
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
