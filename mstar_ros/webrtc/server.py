"""The voice gateway's HTTP side (aiohttp): signalling, limits, authentication.

``/v1/audio/speech`` and ``/v1/models``: mstar_ros.webrtc.openai_http; ``/v1/chat/completions`` for a
model that answers: mstar_ros.webrtc.openai_chat; ``/v1/images/generations`` and ``/v1/images/edits``
for a model that makes images: mstar_ros.webrtc.openai_images. A model that does not speak (no
``audio_output``: mstar_ros.webrtc.image_models) is served on its OpenAI routes and ``/v1/models``
only: no peers, WHIP, page or ``/v1/audio/speech``. ``POST /offer`` takes ``{"sdp", "type": "offer"}`` (JSON) and answers ``{"sdp", "type": "answer",
"pc_id"}``, the shape pipecat's SmallWebRTC clients use; ``DELETE /offer/{pc_id}`` ends a peer.
WHIP (RFC 9725): mstar_ros.webrtc.whip.
No STUN or TURN (``iceServers`` empty), and ICE offers host candidates on the bound address
only (aioice would otherwise announce every interface of the host).

Limits: connections, request heads and bodies (mstar_ros.webrtc.http_guard: 503, 408, 413 counted as
the body arrives), SDP size and garbage SDP (400, with the parser's message), any JSON (400, never a
500), peers (503 once ``max_peers`` are connected), text per response; images are judged by their
headers and decoded within one budget of pixels shared by every route and peer. An offer whose ICE
has not completed holds a slot only until a newer offer needs it: past ``max_pending_peers`` such
offers, or ``max_pending_per_client`` from one address, or a full house, the oldest pending offer is
dropped, so a burst of offers that never connect cannot lock real peers out; and one not connected
within ``connect_timeout_s`` of its offer is dropped anyway. A peer idle for ``idle_timeout_s`` is
dropped too, and one that stops answering ICE consent checks after about ``peer_lost_s``. A host
other than loopback needs a token (mstar_ros.webrtc.gateway_token): every
endpoint then wants ``Authorization: Bearer TOKEN`` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web

from mstar_ros.webrtc.budget import SharedBudget
from mstar_ros.webrtc.gateway_token import TOKEN_ENV, authorised
from mstar_ros.webrtc.http_guard import ConnectionGuard, ConnectionLimits, GuardedSite, body_middleware, request_body
from mstar_ros.webrtc.image_models import makes_images, speaks
from mstar_ros.webrtc.json_body import BadJSON, decode_json
from mstar_ros.webrtc.media_parts import MAX_REQUEST_IMAGE_PIXELS
from mstar_ros.webrtc.openai_errors import openai_error_middleware
from mstar_ros.webrtc.openai_http import OpenAISpeech
from mstar_ros.webrtc.page_files import PUBLIC_PATHS, add_page_routes
from mstar_ros.webrtc.peer import VoicePeer
from mstar_ros.webrtc.whip import WhipEndpoint

log = logging.getLogger("mstar_ros.webrtc")


@dataclass(frozen=True)
class GatewayLimits:
    max_peers: int = 8
    max_body_bytes: int = 64 * 1024
    max_audio_body_bytes: int = 16 * 2**20  # /v1/chat/completions with input audio or images (base64): ~4 min at 24 kHz
    max_image_body_bytes: int = 32 * 2**20  # /v1/images/edits: input images as files or base64
    max_generating_pixels: int = 16 * 2**20  # pixels of images being made at once, all image requests together
    max_sdp_bytes: int = 32 * 1024
    max_text_chars: int = 2000
    idle_timeout_s: float = 300.0  # a peer with no event and nothing playing for this long is dropped
    peer_lost_s: float = 1.5  # a peer that stops answering ICE consent checks is dropped after about this long
    connect_timeout_s: float = 10.0  # a peer whose ICE has not completed this long after its offer is dropped
    max_pending_peers: int = 4  # offers not yet connected, at once (the oldest goes when a newer one needs room)
    max_pending_per_client: int = 2  # of them from one address
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def configure_ice(host: str, peer_lost_s: float) -> None:
    """ICE host candidates on ``host`` only (aioice gathers every interface's address), and consent
    checks (RFC 7675) often enough that a peer that vanishes without a goodbye (a killed tab, a lost
    network) is noticed after about ``peer_lost_s``, not aioice's 30 s (6 checks 5 s apart).
    aioice reads both at run time from its module; this process serves peers only through the gateway."""
    import aioice.ice
    import aioice.stun

    if host != "0.0.0.0":  # bound to every interface: aioice gathers them all, as it does by default
        aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [host]
    # a check times out after one RTO (0.5 s, no retransmission); `failures` missed checks in a row end the
    # peer. Two (the 1.5 s default) drop a peer that loses two checks running: ~1 in 2500 checks at 2%
    # packet loss, so lossy or far networks want a larger peer_lost_s (4 misses from 3 s on)
    failures = 2 if peer_lost_s < 3.0 else 4
    aioice.ice.CONSENT_FAILURES = failures
    aioice.ice.CONSENT_INTERVAL = max(0.05, (peer_lost_s / failures - aioice.stun.RETRY_RTO) / 1.2)


class VoiceGateway:
    def __init__(
        self,
        model,
        conductor,
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        limits: GatewayLimits | None = None,
        model_name: str = "orpheus",
    ) -> None:
        if not is_loopback(host) and not token:
            raise ValueError(
                f"--host {host} is not loopback: give a token (--token-file FILE or ${TOKEN_ENV}; every "
                "endpoint then needs it)"
            )
        self.model, self.conductor, self.host, self.token = model, conductor, host, token
        self.limits = limits or GatewayLimits()
        self.peers: dict[str, VoicePeer] = {}
        self.pending: dict[str, tuple[float, str]] = {}  # not connected yet: (their offer's time.monotonic(), address)
        self.model_name = model_name
        self.guard = ConnectionGuard(self.limits.connections)
        self.decode_budget = SharedBudget(MAX_REQUEST_IMAGE_PIXELS, "pixels of images being decoded")
        self.generate_budget = SharedBudget(self.limits.max_generating_pixels, "pixels of images being generated")
        configure_ice("127.0.0.1" if host == "localhost" else host, self.limits.peer_lost_s)

    def app(self) -> web.Application:
        # the largest body any route takes; each route's own limit is counted as its body is read
        app = web.Application(
            client_max_size=max(
                self.limits.max_body_bytes, self.limits.max_audio_body_bytes, self.limits.max_image_body_bytes
            ),
            middlewares=[
                openai_error_middleware,
                self._auth,  # outermost: /v1/ errors as OpenAI's
                body_middleware(self._body_limit, self.limits.connections),
            ],
        )
        speech = speaks(self.model)
        if speech:  # peers hear the model: a model that does not speak has none
            add_page_routes(app)
            app.router.add_post("/offer", self.offer)
            app.router.add_delete("/offer/{pc_id}", self.delete)
            WhipEndpoint(self).add_routes(app)
        OpenAISpeech(self.model, self.conductor, self.model_name, self.limits.max_text_chars).add_routes(
            app, speech=speech
        )
        if getattr(self.model, "conversational", False):  # a model that answers: chat completions too
            from mstar_ros.webrtc.openai_chat import OpenAIChat

            OpenAIChat(
                self.model, self.conductor, self.model_name, self.limits.max_text_chars, self.decode_budget
            ).add_routes(app)
        if makes_images(self.model):
            from mstar_ros.webrtc.openai_images import OpenAIImages

            OpenAIImages(
                self.model, self.conductor, self.model_name, self.decode_budget, self.generate_budget
            ).add_routes(app)
        app.on_startup.append(self._start_reaper)
        app.on_shutdown.append(self._close_all)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        # the page and its files hold no secret (it reads the token from #token=); a CORS preflight carries none (Fetch)
        needs_token = self.token and request.path not in PUBLIC_PATHS and request.method != "OPTIONS"
        if needs_token and not authorised(request.headers.get("Authorization", ""), self.token):
            raise web.HTTPUnauthorized(text="a Bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    def _body_limit(self, request: web.Request) -> int:
        if request.path == "/v1/images/edits":  # input images, as files or base64
            return self.limits.max_image_body_bytes
        audio = request.path == "/v1/chat/completions"  # input audio and images, base64
        return self.limits.max_audio_body_bytes if audio else self.limits.max_body_bytes

    def site(self, runner: web.BaseRunner, host: str, port: int) -> GuardedSite:
        """The TCP site to serve this gateway's app on: its connections under the gateway's limits."""
        return GuardedSite(runner, host, port, self.guard)

    async def offer(self, request: web.Request) -> web.Response:
        try:
            body = decode_json(await request_body(request))
        except BadJSON:
            raise web.HTTPBadRequest(text='the body must be JSON: {"sdp": ..., "type": "offer"}') from None
        if not isinstance(body, dict) or body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
            raise web.HTTPBadRequest(text='expected {"sdp": "...", "type": "offer"}')
        peer = await self._new_peer(body["sdp"], request.remote or "")
        local = peer.pc.localDescription
        return web.json_response({"sdp": local.sdp, "type": local.type, "pc_id": peer.id})

    async def _make_room(self, client: str) -> None:
        """Drop the oldest pending offers (ICE not completed) that a new offer from ``client`` needs room from."""
        limits, victims = self.limits, []
        theirs = [pc_id for pc_id, (_, address) in self.pending.items() if address == client]
        if len(theirs) >= limits.max_pending_per_client:
            victims.append(theirs[0])
        for pc_id in self.pending:  # oldest first
            full = (
                len(self.pending) - len(victims) >= limits.max_pending_peers
                or len(self.peers) - len(victims) >= limits.max_peers
            )
            if not full:
                break
            if pc_id not in victims:
                victims.append(pc_id)
        for pc_id in victims:
            log.info(
                "peer %s: dropped before it connected (%.1f s after its offer): a newer offer needed its slot",
                pc_id,
                time.monotonic() - self.pending[pc_id][0],
            )
            await self._drop(pc_id)

    async def _new_peer(self, sdp: str, client: str) -> VoicePeer:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        if len(sdp) > self.limits.max_sdp_bytes:
            raise web.HTTPBadRequest(text=f"SDP of {len(sdp)} bytes is over the {self.limits.max_sdp_bytes} limit")
        await self._make_room(client)
        if len(self.peers) >= self.limits.max_peers:
            raise web.HTTPServiceUnavailable(text=f"{self.limits.max_peers} peers are connected (the limit)")
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        peer = VoicePeer(
            pc,
            self.model,
            self.conductor,
            max_text_chars=self.limits.max_text_chars,
            decode_budget=self.decode_budget,
            model_name=self.model_name,
        )
        self.peers[peer.id] = peer
        self.pending[peer.id] = (time.monotonic(), client)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState == "connected":
                self.pending.pop(peer.id, None)
            elif pc.connectionState in ("failed", "closed"):
                await self._drop(peer.id)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError / others on SDP it cannot take
            await self._drop(peer.id)
            raise web.HTTPBadRequest(text=f"cannot take this SDP offer: {type(exc).__name__}: {exc}") from None
        log.info("peer %s connected (%d of %d)", peer.id, len(self.peers), self.limits.max_peers)
        return peer

    async def delete(self, request: web.Request) -> web.Response:
        pc_id = request.match_info["pc_id"]
        if pc_id not in self.peers:
            raise web.HTTPNotFound(text=f"no peer {pc_id}")
        await self._drop(pc_id)
        return web.Response(status=204)

    async def _drop(self, pc_id: str) -> None:
        self.pending.pop(pc_id, None)
        peer = self.peers.pop(pc_id, None)
        if peer is not None:
            await peer.close()
            log.info("peer %s gone (%d left)", pc_id, len(self.peers))

    async def _start_reaper(self, _app) -> None:
        self._reaper = asyncio.ensure_future(self._reap_idle())

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.limits.idle_timeout_s / 4, self.limits.connect_timeout_s / 4))
            now = time.monotonic()
            for pc_id, (offered, _) in list(self.pending.items()):
                if now - offered > self.limits.connect_timeout_s:
                    log.info(
                        "peer %s: not connected %.0f s after its offer (ICE never completed; connect_timeout_s "
                        "%g): dropped",
                        pc_id,
                        now - offered,
                        self.limits.connect_timeout_s,
                    )
                    await self._drop(pc_id)
            for pc_id, peer in list(self.peers.items()):
                if peer.closed or peer.idle_s > self.limits.idle_timeout_s:
                    log.info(
                        "peer %s: %s",
                        pc_id,
                        "closed"
                        if peer.closed
                        else f"idle for {peer.idle_s:.0f} s (idle_timeout_s {self.limits.idle_timeout_s:g})",
                    )
                    await self._drop(pc_id)

    async def _close_all(self, _app) -> None:
        reaper = getattr(self, "_reaper", None)
        if reaper is not None:
            reaper.cancel()
        await asyncio.gather(*(self._drop(pc_id) for pc_id in list(self.peers)))


async def serve_on_free_port(gateway: VoiceGateway, host: str = "127.0.0.1") -> tuple[web.AppRunner, str]:
    """The gateway's app on ``host``:<a free port> (benchmarks, tests): (runner to clean up, base URL)."""
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    site = gateway.site(runner, host, 0)
    await site.start()
    return runner, f"http://{host}:{site.port}"
