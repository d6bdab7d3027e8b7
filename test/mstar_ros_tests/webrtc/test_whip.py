"""WHIP (RFC 9725) on the gateway, driven by clients written to the RFC: aiortc peers with aiohttp, and a
headless Chromium on another origin (CORS) offering audio and video."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiohttp import ClientSession
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from support.chromium import ARGS, CHROMIUM
from support.webrtc_gateway import gateway_for

SDP = {"Content-Type": "application/sdp"}
FRAG = "application/trickle-ice-sdpfrag"


class WhipPeer:
    """An aiortc peer that hears the gateway's audio track: loud 20 ms frames are counted."""

    def __init__(self, *kinds: str) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        for kind in kinds or ("audio",):
            self.pc.addTransceiver(kind, direction="recvonly" if kind == "audio" else "sendonly")
        self.loud = 0
        self.pc.on("track", lambda track: asyncio.ensure_future(self._read(track)))

    async def _read(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.loud += bool(np.abs(frame.to_ndarray()).max() > 0)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def until(self, predicate, timeout: float, what: str) -> None:
        for _ in range(int(timeout / 0.05)):
            if predicate():
                return
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{what} within {timeout} s")


def test_a_whip_client_posts_its_offer_hears_posted_text_and_deletes_its_session(orpheus):
    async def main():
        out = {}
        async with gateway_for(orpheus) as (_, gateway, url):
            client = WhipPeer()
            try:
                async with ClientSession() as http:
                    async with http.post(f"{url}/whip", data=await client.offer(), headers=SDP) as r:
                        out["created"] = r.status, r.headers["Content-Type"], r.headers.get("Link")
                        out["cors"] = (
                            r.headers.get("Access-Control-Allow-Origin"),
                            r.headers.get("Access-Control-Expose-Headers"),
                        )
                        location, etag, answer = r.headers["Location"], r.headers["ETag"], await r.text()
                    out["location"], out["etag"] = location, etag
                    await client.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
                    await client.until(lambda: client.pc.connectionState == "connected", 20, "connected")
                    async with http.post(
                        f"{url}{location}", data="Hello over WHIP.", headers={"Content-Type": "text/plain"}
                    ) as r:
                        out["spoken"] = r.status
                    await client.until(lambda: client.loud > 10, 60, "the posted text's audio")
                    async with http.post(
                        f"{url}{location}", data="x" * 2001, headers={"Content-Type": "text/plain; charset=utf-8"}
                    ) as r:
                        out["too_long"] = r.status, await r.text()
                    async with http.post(f"{url}{location}", data=" ", headers={"Content-Type": "text/plain"}) as r:
                        out["empty"] = r.status, await r.text()
                    patch = {"Content-Type": FRAG}
                    fragment = "a=mid:0\r\na=end-of-candidates\r\n"
                    async with http.patch(f"{url}{location}", data=fragment, headers=patch) as r:
                        out["no_if_match"] = r.status
                    async with http.patch(
                        f"{url}{location}", data=fragment, headers={**patch, "If-Match": '"old"'}
                    ) as r:
                        out["stale"] = r.status
                    async with http.patch(f"{url}{location}", data=fragment, headers={**patch, "If-Match": "*"}) as r:
                        out["restart"] = r.status, await r.text()
                    async with http.patch(
                        f"{url}{location}", data=fragment, headers={"Content-Type": "text/plain", "If-Match": etag}
                    ) as r:
                        out["wrong_fragment_type"] = r.status
                    async with http.post(f"{url}/whip", data="v=0", headers={"Content-Type": "text/plain"}) as r:
                        out["wrong_type"] = r.status
                    async with http.get(f"{url}{location}") as r:
                        out["get"] = r.status
                    async with http.delete(f"{url}{location}") as r:
                        out["deleted"] = r.status
                    out["peers_after"] = len(gateway.peers)
                    async with http.delete(f"{url}{location}") as r:
                        out["again"] = r.status
                    async with http.patch(f"{url}{location}", data=fragment, headers={**patch, "If-Match": etag}) as r:
                        out["patch_gone"] = r.status
            finally:
                await client.pc.close()
        return out

    out = asyncio.run(main())
    assert out["created"] == (201, "application/sdp", None)  # no charset; no Link: the gateway uses no STUN/TURN
    assert out["cors"] == (None, None)  # no token: no other origin may drive it (the token test reads them)
    assert out["location"].startswith("/whip/") and out["etag"].startswith('"') and out["etag"].endswith('"')
    assert out["spoken"] == 202
    assert out["too_long"][0] == 400 and "over the 2000 limit" in out["too_long"][1]
    assert out["empty"][0] == 400 and "empty" in out["empty"][1]
    assert out["no_if_match"] == 428 and out["stale"] == 412
    assert out["restart"][0] == 422 and "ICE restart is not supported" in out["restart"][1]
    assert out["wrong_fragment_type"] == 415 and out["wrong_type"] == 415 and out["get"] == 405
    assert out["deleted"] == 200 and out["peers_after"] == 0 and out["again"] == 404 and out["patch_gone"] == 404


def test_candidates_trickled_by_patch_reach_the_gateways_ice_agent(orpheus):
    """The offer goes without its candidates; they follow in a PATCH with the ETag (204), as a trickling WHIP
    client sends them, and the gateway's ICE agent pairs them as the client's host candidates (not ones it
    discovered from the client's checks). A fragment naming other ICE credentials is a restart: 422."""

    async def main():
        out = {}
        async with gateway_for(orpheus) as (_, gateway, url):
            client = WhipPeer()
            try:
                offer = await client.offer()
                lines = offer.splitlines()
                held = [line for line in lines if line.startswith("a=candidate:")]
                bare = "\r\n".join(line for line in lines if not line.startswith(("a=candidate:", "a=end-of-cand")))
                async with ClientSession() as http:
                    async with http.post(f"{url}/whip", data=bare + "\r\n", headers=SDP) as r:
                        location, etag, answer = r.headers["Location"], r.headers["ETag"], await r.text()
                    await client.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
                    ufrag = next(line for line in lines if line.startswith("a=ice-ufrag:"))
                    fragment = "\r\n".join(
                        [
                            "a=ice-options:trickle",
                            "m=audio 9 UDP/TLS/RTP/SAVPF 0",
                            "a=mid:0",
                            ufrag,
                            "a=candidate:1 1 udp 1 not-enough-fields",
                            *held,
                            "a=end-of-candidates",
                        ]
                    )
                    async with http.patch(
                        f"{url}{location}", data=fragment + "\r\n", headers={"Content-Type": FRAG, "If-Match": etag}
                    ) as r:
                        out["trickled"] = r.status, r.headers.get("ETag")
                    await client.until(lambda: client.pc.connectionState == "connected", 20, "connected")
                    peer = gateway.peers[location.rsplit("/", 1)[1]]
                    transport = peer.pc.getTransceivers()[0].receiver.transport.transport
                    out["remote"] = {(c.ip, c.port, c.type) for c in transport.getRemoteCandidates()}
                    async with http.patch(
                        f"{url}{location}",
                        data="a=ice-ufrag:other\r\na=ice-pwd:otherpassword\r\n",
                        headers={"Content-Type": FRAG, "If-Match": etag},
                    ) as r:
                        out["new_ufrag"] = r.status
            finally:
                await client.pc.close()
        return out, held

    out, held = asyncio.run(main())
    assert held, "the client offered no candidate to trickle"
    assert out["trickled"] == (204, None)  # a trickle PATCH changes no ETag (RFC 9725 §4.3.1)
    sent = {(c.split()[4], int(c.split()[5]), c.split()[7]) for c in held}
    assert sent <= out["remote"], (sent, out["remote"])
    assert out["new_ufrag"] == 422


def test_the_answer_rejects_video_with_port_0_and_an_offer_without_audio_is_refused(orpheus):
    async def main():
        out = {}
        async with gateway_for(orpheus) as (_, gateway, url):
            both, video = WhipPeer("video", "audio"), WhipPeer("video")  # video first: it holds the bundle's tag
            try:
                async with ClientSession() as http:
                    async with http.post(f"{url}/whip", data=await both.offer(), headers=SDP) as r:
                        out["both"] = r.status, await r.text(), r.headers["Location"]
                    out["kinds"] = [
                        t.kind for t in gateway.peers[out["both"][2].rsplit("/", 1)[1]].pc.getTransceivers()
                    ]
                    async with http.post(f"{url}/whip", data=await video.offer(), headers=SDP) as r:
                        out["video_only"] = r.status, await r.text()
            finally:
                await both.pc.close()
                await video.pc.close()
        return out

    out = asyncio.run(main())
    status, answer, _ = out["both"]
    assert status == 201
    sections = answer.split("\r\nm=")
    video, audio = sections[1], sections[2]
    assert video.startswith("video 0 UDP/TLS/RTP/SAVPF ") and "a=mid:0" in video and "a=candidate" not in video
    assert audio.startswith("audio ") and not audio.startswith("audio 0 ") and "a=mid:1" in audio
    assert "a=sendonly" in audio and "a=candidate:" in audio
    assert "a=group:BUNDLE 1\r\n" in answer  # the rejected section is out of the bundle
    assert out["kinds"] == ["audio"]  # aiortc never saw the video
    assert out["video_only"][0] == 400 and "no audio m-section" in out["video_only"][1]


def test_preflight_needs_no_token_and_refusals_are_readable_across_origins(orpheus):
    async def main():
        async with gateway_for(orpheus, token="s3cret") as (_, _, url):
            async with ClientSession() as http:
                got = {}
                for path in ("/whip", "/whip/abc"):
                    async with http.options(
                        f"{url}{path}",
                        headers={
                            "Origin": "http://example.test",
                            "Access-Control-Request-Method": "POST",
                            "Access-Control-Request-Headers": "authorization, content-type",
                        },
                    ) as r:
                        got[path] = r.status, dict(r.headers)
                async with http.post(f"{url}/whip", data="v=0", headers=SDP) as r:
                    got["unauthorised"] = r.status, r.headers.get("Access-Control-Allow-Origin")
        async with gateway_for(orpheus) as (_, _, url):  # no token: no other origin may drive it
            async with ClientSession() as http:
                async with http.options(
                    f"{url}/whip", headers={"Origin": "http://example.test", "Access-Control-Request-Method": "POST"}
                ) as r:
                    got["tokenless"] = r.status, r.headers.get("Access-Control-Allow-Origin")
        return got

    got = asyncio.run(main())
    for path in ("/whip", "/whip/abc"):
        status, headers = got[path]
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"
        assert set(headers["Access-Control-Allow-Methods"].split(", ")) >= {"POST", "PATCH", "DELETE"}
        assert set(headers["Access-Control-Allow-Headers"].split(", ")) >= {"Authorization", "Content-Type", "If-Match"}
        assert headers["Access-Control-Expose-Headers"] == "Location, ETag, Link"
        assert headers["Accept-Post"] == "application/sdp"
    assert got["unauthorised"] == (401, "*")
    assert got["tokenless"] == (403, None)


BROWSER_WHIP = """async ([endpoint, token]) => {
  const stream = await navigator.mediaDevices.getUserMedia({audio: true, video: true});
  const pc = new RTCPeerConnection({iceServers: [], bundlePolicy: "max-bundle"});
  stream.getAudioTracks()[0].enabled = false;  // silence: the fake device's beeps must not barge in
  pc.addTransceiver(stream.getAudioTracks()[0], {direction: "sendrecv", streams: [stream]});
  const video = pc.addTransceiver(stream.getVideoTracks()[0], {direction: "sendonly", streams: [stream]});
  const heard = new Promise(resolve => pc.ontrack = e => {  // played, or Chromium decodes nothing
    const audio = new Audio(); audio.srcObject = new MediaStream([e.track]); audio.play(); resolve(e.track.kind); });
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise(resolve => pc.iceGatheringState === "complete" ? resolve() :
                    pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && resolve());
  const auth = {"Authorization": "Bearer " + token};
  const r = await fetch(endpoint, {method: "POST", body: pc.localDescription.sdp,
                                   headers: {...auth, "Content-Type": "application/sdp"}});
  const location = new URL(r.headers.get("Location"), endpoint).href;
  const etag = r.headers.get("ETag");
  await pc.setRemoteDescription({type: "answer", sdp: await r.text()});
  await new Promise(resolve => pc.connectionState === "connected" ? resolve() :
                    pc.onconnectionstatechange = () => pc.connectionState === "connected" && resolve());
  const spoken = await fetch(location, {method: "POST", body: "Hello from a browser over WHIP.",
                                        headers: {...auth, "Content-Type": "text/plain"}});
  let energy = 0;  // the gateway sends digital silence between responses: energy means the text's audio
  for (let i = 0; i < 600 && !(energy > 0); i++) {
    await new Promise(resolve => setTimeout(resolve, 100));
    (await pc.getStats()).forEach(s => { if (s.type === "inbound-rtp" && s.kind === "audio") energy = s.totalAudioEnergy; });
  }
  const deleted = await fetch(location, {method: "DELETE", headers: auth});
  const result = {status: r.status, etag, location, videoDirection: video.currentDirection, kind: await heard,
                  spoken: spoken.status, energy, deleted: deleted.status};
  pc.close();
  return result;
}"""


@pytest.mark.timeout(240)
@pytest.mark.browser
def test_a_browser_whip_client_on_another_origin_sends_audio_and_video_and_hears_its_text(orpheus):
    """Chromium on http://localhost:PORT posts to http://127.0.0.1:PORT/whip with a token (another origin:
    a CORS preflight), reads Location and ETag, takes the answer that rejects its video, hears the text it
    posts, and deletes its session."""
    from playwright.async_api import async_playwright

    async def main():
        async with gateway_for(orpheus, token="s3cret") as (_, gateway, url):
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
                try:
                    page = await browser.new_page()
                    await page.goto(url.replace("127.0.0.1", "localhost") + "/")
                    result = await page.evaluate(BROWSER_WHIP, [f"{url}/whip", "s3cret"])
                finally:
                    await browser.close()
            return result, len(gateway.peers)

    result, peers_after = asyncio.run(main())
    assert result["status"] == 201 and result["etag"] and "/whip/" in result["location"], result
    assert result["videoDirection"] == "stopped" and result["kind"] == "audio", result
    assert result["spoken"] == 202 and result["energy"] > 0, result
    assert result["deleted"] == 200 and peers_after == 0
