"""WHIP (RFC 9725) on the voice gateway: a session per ``POST /whip``, at the ``Location`` it answers.

- ``POST /whip`` (``application/sdp``): ``201 Created``, the answer as ``application/sdp`` (no charset),
  ``Location: /whip/ID`` and an ``ETag``. The answer rejects every m-section that is not audio (a video
  one gets port 0, RFC 3264 §6; mstar_ros.webrtc.sdp_sections) and an offer without audio is a 400.
- ``PATCH /whip/ID`` (``application/trickle-ice-sdpfrag``, RFC 9725 §4.3): Trickle ICE. The client's
  candidates go to aiortc (204), with ``If-Match`` naming the ETag (428 without one, 412 for another).
  ICE restarts (``If-Match: *``, or a new ice-ufrag) get 422, as the RFC asks of a session that trickles
  but cannot restart: aiortc cannot restart ICE. A client DELETEs and POSTs a new offer instead.
- ``DELETE /whip/ID``: 200 (the RFC's figure), and 404 for a session that has gone.
- ``POST /whip/ID`` (``text/plain``): our extension, as WHIP has no data channel: the text is the
  peer's next response, as ``response.create`` with that text would be on a data channel (spoken by a
  text-to-speech model, answered by one that converses); 202, or 400 with the reason.
- ``OPTIONS`` on both: the CORS preflight a browser WHIP client sends (no token needed, as Fetch sends
  none), with ``Accept-Post: application/sdp``. On a gateway with a token every WHIP response lets any
  origin read it and exposes ``Location``, ``ETag`` and ``Link`` (the token, not the origin, guards it).
  A gateway without a token sends no CORS headers: any web page the user opens could otherwise drive a
  loopback gateway; only its own page (same origin) and non-browser clients reach it.
- No ``Link`` headers (RFC 9725 §4.6: the endpoint MAY name STUN/TURN servers): the gateway uses none.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from aiohttp import web

from mstar_ros.webrtc.http_guard import request_body
from mstar_ros.webrtc.ice_fragment import BadFragment, offer_ufrag, parse_fragment
from mstar_ros.webrtc.sdp_sections import BadSDP, split_offer

log = logging.getLogger("mstar_ros.webrtc")

SDP = "application/sdp"
FRAGMENT = "application/trickle-ice-sdpfrag"
KINDS = frozenset({"audio", "application"})  # the m-sections the gateway answers; others are rejected
EXPOSED = {"Access-Control-Allow-Origin": "*", "Access-Control-Expose-Headers": "Location, ETag, Link"}
PREFLIGHT = {
    "Access-Control-Allow-Methods": "POST, PATCH, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, If-Match",
    "Access-Control-Max-Age": "600",
    "Accept-Post": SDP,
}


class PeerEvents:
    """Where a WHIP peer's Realtime events go in place of a data channel: errors are counted and logged
    (the request that caused one answers it), the rest is dropped, as no one listens."""

    readyState = "open"

    def __init__(self, pc_id: str) -> None:
        self.pc_id, self.errors, self.last_error = pc_id, 0, ""

    def send(self, message: str) -> None:
        event = json.loads(message)
        if event.get("type") == "error":
            self.errors += 1
            self.last_error = event.get("error", {}).get("message", "")
            log.info("WHIP peer %s: %s", self.pc_id, self.last_error)


@dataclass
class WhipSession:
    etag: str
    ufrag: str | None  # the client's ICE credentials from its offer: another one in a PATCH is a restart
    mid: str | None  # the bundle's transport (the first section answered): where candidates go
    events: PeerEvents


class WhipEndpoint:
    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.sessions: dict[str, WhipSession] = {}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("OPTIONS", "/whip", self.preflight)
        app.router.add_post("/whip", self.create)
        app.router.add_route("OPTIONS", "/whip/{pc_id}", self.preflight)
        app.router.add_patch("/whip/{pc_id}", self.trickle)
        app.router.add_delete("/whip/{pc_id}", self.delete)
        app.router.add_post("/whip/{pc_id}", self.speak)
        app.on_response_prepare.append(self._cors)

    async def _cors(self, request: web.Request, response: web.StreamResponse) -> None:
        if not self.gateway.token:
            return  # no token to guard it: no other origin may use it
        if request.path == "/whip" or request.path.startswith("/whip/"):  # errors too: a browser reads them
            response.headers.update(EXPOSED)

    async def preflight(self, _request: web.Request) -> web.Response:
        if not self.gateway.token:
            raise web.HTTPForbidden(text="cross-origin WHIP needs a gateway with a token (--token-file)")
        return web.Response(status=200, headers=PREFLIGHT)

    async def create(self, request: web.Request) -> web.Response:
        sdp = await _text(request, SDP, "the offer")
        limit = self.gateway.limits.max_sdp_bytes
        if len(sdp) > limit:
            raise web.HTTPBadRequest(text=f"SDP of {len(sdp)} bytes is over the {limit} limit")
        offer = split_offer(sdp, KINDS)
        kept = offer.kept_sections()
        if not any(s.kind == "audio" for s in kept):
            raise web.HTTPBadRequest(
                text="the offer has no audio m-section: the gateway takes and sends audio (other media are rejected)"
            )
        peer = await self.gateway._new_peer(offer.offer_for_aiortc(), request.remote or "")
        try:
            answer = offer.answer(peer.pc.localDescription.sdp)
        except BadSDP as exc:
            await self.gateway._drop(peer.id)
            raise web.HTTPBadRequest(text=f"cannot take this SDP offer: {exc}") from None
        self.sessions = {pc_id: s for pc_id, s in self.sessions.items() if pc_id in self.gateway.peers}
        events = PeerEvents(peer.id)
        peer.channel = events  # WHIP has no data channel
        session = WhipSession(f'"{uuid.uuid4().hex}"', offer_ufrag(sdp), kept[0].mid, events)
        self.sessions[peer.id] = session
        if offer.rejected_mids:
            log.info(
                "WHIP peer %s: rejected m-section(s) %s (the gateway takes audio only)",
                peer.id,
                ", ".join(offer.rejected_mids),
            )
        return web.Response(
            status=201,
            body=answer.encode(),
            content_type=SDP,
            headers={"Location": f"/whip/{peer.id}", "ETag": session.etag},
        )

    def _session(self, request: web.Request) -> tuple[WhipSession, object]:
        pc_id = request.match_info["pc_id"]
        session, peer = self.sessions.get(pc_id), self.gateway.peers.get(pc_id)
        if session is None or peer is None:
            raise web.HTTPNotFound(text=f"no WHIP session {pc_id}")
        return session, peer

    async def trickle(self, request: web.Request) -> web.Response:
        from aiortc.sdp import candidate_from_sdp

        session, peer = self._session(request)
        match = request.headers.get("If-Match")
        if match is None:
            raise web.HTTPPreconditionRequired(text=f"PATCH needs If-Match: {session.etag} (this session's ETag)")
        if match.strip() == "*":
            raise _no_restart()
        if match.strip() != session.etag:
            raise web.HTTPPreconditionFailed(text=f"If-Match {match} is not this session's ETag {session.etag}")
        try:
            fragment = parse_fragment(await _text(request, FRAGMENT, "the ICE fragment"))
        except BadFragment as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        if fragment.ufrag is not None and fragment.ufrag != session.ufrag:
            raise _no_restart()
        for text in fragment.candidates:
            bits = text.split()
            try:
                if len(bits) < 8:
                    raise ValueError("too few fields")
                candidate = candidate_from_sdp(text)
            except ValueError as exc:  # RFC 9725 §4.3.1: a candidate the session cannot use is ignored
                log.info("WHIP peer %s: candidate %r ignored (%s)", peer.id, text[:120], exc)
                continue
            candidate.sdpMid = session.mid
            await peer.pc.addIceCandidate(candidate)
        if fragment.end:
            await peer.pc.addIceCandidate(None)
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.Response:
        _, peer = self._session(request)
        self.sessions.pop(peer.id, None)
        await self.gateway._drop(peer.id)
        return web.Response(status=200)

    async def speak(self, request: web.Request) -> web.Response:
        session, peer = self._session(request)
        text = await _text(request, "text/plain", "the text of the next response")
        if not text.strip():
            raise web.HTTPBadRequest(text="the body is the text of the next response: it is empty")
        errors = session.events.errors
        await peer.on_event(json.dumps({"type": "response.create", "text": text}))
        if session.events.errors > errors:
            raise web.HTTPBadRequest(text=session.events.last_error)
        return web.Response(status=202)


async def _text(request: web.Request, content_type: str, what: str) -> str:
    if request.content_type != content_type:
        raise web.HTTPUnsupportedMediaType(text=f"{what} goes as {content_type}, not {request.content_type}")
    try:
        return (await request_body(request)).decode()
    except UnicodeDecodeError:
        raise web.HTTPBadRequest(text=f"{what} is not UTF-8") from None


def _no_restart() -> web.HTTPException:
    return web.HTTPUnprocessableEntity(
        text="ICE restart is not supported (aiortc cannot restart ICE): DELETE this session and POST a new offer"
    )
