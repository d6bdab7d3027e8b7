"""``mstar-ros serve voice``: a speech model behind the WebRTC gateway (signalling over HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from mstar_ros.dtype_option import add_dtype_argument, engine_config
from mstar_ros.webrtc.speech_models import speech_model_names
from mstar_ros.webrtc.urls import base_url


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model to WebRTC peers (browsers) over HTTP signalling")
    what = p.add_subparsers(dest="serve", required=True, metavar="WHAT")
    v = what.add_parser(
        "voice",
        help="a speech model: peers send text on a data channel and hear the audio as it is decoded",
        description="Serve a speech model (--model; installed: see mstar.speech_models entry points) to WebRTC "
        "peers. POST /offer with {sdp, type} answers {sdp, type, pc_id}; DELETE /offer/PC_ID ends a "
        "peer. On the peer's data channel, response.create with text is spoken: the graph's audio "
        "chunks go to the peer's audio track as 48 kHz Opus in 20 ms frames, paced by a clock; "
        "response.cancel stops it and frees the request's KV. Events are named and shaped as the "
        "OpenAI Realtime API's WebRTC transport has them (response items and parts, output_audio_buffer."
        "started/stopped/cleared, input_audio_buffer.append/commit, conversation.item.delete/truncate, "
        "GA session.update; a voice the model lacks or a field not served is an error naming it). "
        "No STUN/TURN; ICE host candidates on the bound address only. "
        "Also OpenAI-compatible POST /v1/audio/speech (response_format mp3 (default), opus, aac, flac, wav "
        "or pcm, streamed as encoded, or sse with usage; speed 0.25-4; instructions where the model "
        "takes them; input up to 4096 characters), GET /v1/models (created, random_weights) and, for "
        "a model that answers, POST /v1/chat/completions; their errors are OpenAI's JSON (error.message, "
        "type, param, code). "
        "WHIP (RFC 9725): POST /whip with application/sdp answers 201, the SDP, Location /whip/ID and "
        "an ETag; PATCH /whip/ID trickles ICE candidates (ICE restart: 422); DELETE /whip/ID ends it; "
        "POST /whip/ID with text/plain is the peer's next response (WHIP has no data channel). "
        "GET / is the page. It prints the page's, /offer's, /whip's and the OpenAI base URL. Ctrl-C or "
        "SIGTERM stops it (also as a script's background job), exit status 0. A model that does not speak "
        "(answers in text, makes images: BAGEL) is served on its OpenAI routes only: /v1/models, "
        "/v1/chat/completions, /v1/images/generations and /v1/images/edits as it has them.",
    )
    names = speech_model_names()
    v.add_argument(
        "--model",
        default="orpheus",
        choices=names,
        help=f"speech model: one of those installed (entry points mstar.speech_models): {', '.join(names)} "
        "(default orpheus)",
    )
    v.add_argument("--weights", help="checkpoint directory (default: the generated tiny one, RANDOM weights)")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --token)")
    v.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free one, printed)")
    v.add_argument(
        "--token-file",
        type=Path,
        help="file holding the Bearer token every endpoint then requires (needed with a non-loopback "
        "--host; or set $MSTAR_GATEWAY_TOKEN)",
    )
    v.add_argument(
        "--token",
        help="the token itself (deprecated: every user of the host sees argv in ps; use "
        "--token-file or $MSTAR_GATEWAY_TOKEN)",
    )
    v.add_argument("--max-peers", type=int, default=8, help="peers at once; the next one gets 503 (default 8)")
    v.add_argument(
        "--connect-timeout-s",
        type=float,
        default=10.0,
        help="a peer whose ICE has not completed this long after its offer is dropped (default 10 s); "
        "before that, a newer offer takes its slot when it needs one (past 4 such offers, or 2 "
        "from one address)",
    )
    v.add_argument(
        "--max-connections",
        type=int,
        default=256,
        help="HTTP connections at once; the next gets 503 (default 256). A connection must send a whole "
        "request head within 10 s and a body within 60 s (408 otherwise)",
    )
    v.add_argument(
        "--peer-lost-s",
        type=float,
        default=1.5,
        help="a peer that stops answering ICE consent checks is dropped after about this long (default "
        "1.5 s; on lossy or far networks use 5 or more, or a packet loss burst drops a peer); a "
        "peer dropped so is logged with its cause",
    )
    add_dtype_argument(v, default=None)
    v.add_argument("--engine-config", type=Path, help="engine settings YAML (see config/engine.yaml)")
    v.add_argument(
        "--placement",
        type=Path,
        help="placement YAML (see config/placement/): run the model's nodes in Worker processes per rank, "
        "off the process that runs the peers' media (e.g. orpheus-one-worker.yaml)",
    )
    v.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: until Ctrl-C)")
    v.set_defaults(run=_run_voice)


def _run_voice(args: argparse.Namespace) -> int:
    from aiohttp import web

    from mstar_ros.webrtc.gateway_token import gateway_token
    from mstar_ros.webrtc.http_guard import ConnectionLimits
    from mstar_ros.webrtc.image_models import speaks
    from mstar_ros.webrtc.server import GatewayLimits, VoiceGateway
    from mstar_ros.webrtc.speech_models import load_speech_model, speech_conductor

    if args.max_peers < 1 or args.peer_lost_s <= 0.5:
        raise ValueError("--max-peers must be >= 1 and --peer-lost-s > 0.5 (one consent check's timeout)")
    if args.connect_timeout_s <= 0 or args.max_connections < 1:
        raise ValueError("--connect-timeout-s must be > 0 and --max-connections >= 1")
    token = gateway_token(args.token, args.token_file)
    limits = GatewayLimits(
        max_peers=args.max_peers,
        peer_lost_s=args.peer_lost_s,
        connect_timeout_s=args.connect_timeout_s,
        connections=ConnectionLimits(max_connections=args.max_connections),
    )
    # under a placement the Worker processes load the weights; this process only builds requests
    model = load_speech_model(args.model, args.weights, requests_only=args.placement is not None)
    config = engine_config(args)
    log = logging.getLogger("mstar_ros.webrtc")

    async def main() -> None:
        async with speech_conductor(model, config, args.placement) as conductor:
            gateway = VoiceGateway(model, conductor, host=args.host, token=token, limits=limits, model_name=args.model)
            runner = web.AppRunner(gateway.app())
            await runner.setup()
            await gateway.site(runner, args.host, args.port).start()
            port = runner.addresses[0][1]  # --port 0: the one the system gave
            random = getattr(model, "random_weights", False)
            where = f" in Worker processes per {args.placement}" if args.placement else ""
            base = base_url(args.host, port)
            if speaks(model):
                note = " (RANDOM weights: the audio is noise)" if random else ""
                head = f"serving {args.model}{note}{where} to WebRTC peers: POST {base}/offer\n"
                urls = other_urls(base, token is not None)
            else:  # no peers: its OpenAI routes only
                note = " (RANDOM weights: its answers and images are noise)" if random else ""
                head = f"serving {args.model}{note}{where} (it does not speak: no WebRTC peers)\n"
                urls = f"  OpenAI base URL: {base}/v1 ({', '.join(openai_routes(model))})"
            banner = f"{head}{urls}\n  dtype {conductor.dtype_summary()}"
            try:
                await until_stopped(args.duration, lambda: print(banner, flush=True))
            finally:
                log.info("stopping: closing %d peer(s)", len(gateway.peers))
                await runner.cleanup()

    # Ctrl-C while the model loads too, where SIGINT came ignored (a background job); serving has its own handlers
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0


def openai_routes(model) -> list[str]:
    """The OpenAI routes a model that does not speak is served on."""
    routes = ["/models"]
    if getattr(model, "conversational", False):
        routes.append("/chat/completions")
    if getattr(model, "image_generation", False):
        routes.append("/images/generations")
    if getattr(model, "image_edit", False):
        routes.append("/images/edits")
    return routes


def other_urls(base: str, token: bool) -> str:
    """The page's URL (with a token: where the page reads it from, never the token itself), WHIP's and
    the OpenAI base URL, one a line."""
    page = (
        f"{base}/#token=YOUR_TOKEN (the fragment stays in the browser; the page sends it as a Bearer header)"
        if token
        else f"{base}/"
    )
    return f"  page: {page}\n  WHIP: POST {base}/whip\n  OpenAI base URL: {base}/v1"


async def until_stopped(duration: float, started: Callable[[], None]) -> None:
    """Until SIGINT or SIGTERM, or ``duration`` seconds (0: no limit); ``started`` runs once the handlers are
    in, so whoever reads what it prints may signal at once. Handlers of our own: a shell starts a script's
    background job with SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        started()
        await asyncio.wait_for(stop.wait(), duration or None)
    except asyncio.TimeoutError:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
