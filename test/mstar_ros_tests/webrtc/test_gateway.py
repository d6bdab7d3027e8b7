"""The voice gateway with real aiortc peers on loopback: signalling, audio out, events, barge-in, limits."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from aiohttp import ClientSession
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from mstar.conductor import Conductor
from support.webrtc_gateway import serve_gateway
from mstar_ros.webrtc.server import GatewayLimits, VoiceGateway




class Client:
    """A WebRTC peer as a browser is one: a data channel for events, an audio track received."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict] = []
        self.opened = asyncio.Event()
        self.frames: list[np.ndarray] = []
        self.pc.addTransceiver("audio", direction="recvonly")
        self.channel.on("open", self.opened.set)
        self.channel.on("message", lambda m: self.events.append(json.loads(m)))
        self.pc.on("track", self._on_track)
        self._reader: asyncio.Task | None = None

    def _on_track(self, track) -> None:
        async def read() -> None:
            while True:
                frame = await track.recv()
                self.frames.append(frame.to_ndarray().reshape(-1))
        self._reader = asyncio.ensure_future(read())

    async def connect(self, http: ClientSession, url: str) -> dict:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with http.post(f"{url}/offer", json={"sdp": self.pc.localDescription.sdp, "type": "offer"}) as r:
            assert r.status == 200, await r.text()
            answer = await r.json()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        await asyncio.wait_for(self.opened.wait(), 20)
        return answer

    def send(self, **event) -> None:
        self.channel.send(json.dumps(event))

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def until(self, predicate, timeout: float, what: str) -> None:
        for _ in range(int(timeout / 0.02)):
            if predicate():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}; events {self.types()}")

    def loud_frames(self) -> int:
        return sum(int(np.abs(f).max() > 0) for f in self.frames)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()


def test_a_peer_hears_the_response_and_gets_its_events_then_barges_in(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle_blocks = c.kv_blocks_used()
            gateway = VoiceGateway(orpheus, c)
            runner, url = await serve_gateway(gateway)
            client = Client()
            try:
                async with ClientSession() as http:
                    answer = await client.connect(http, url)
                    assert answer["type"] == "answer" and answer["pc_id"] in gateway.peers
                    await client.until(lambda: "session.created" in client.types(), 10, "session.created")
                    client.send(type="response.create", response={"instructions": "Hello there, how are you?"})
                    await client.until(lambda: "response.done" in client.types(), 60, "response.done")
                    heard = client.loud_frames()
                    peer = gateway.peers[answer["pc_id"]]
                    # barge-in: a long response, cancelled once audio flows
                    client.send(type="response.create", text="This is a long sentence that goes on " * 6)
                    await client.until(lambda: peer.track.frames_with_audio > heard + 5, 60, "the second response's audio")
                    client.send(type="response.cancel")
                    await client.until(lambda: client.types().count("response.done") == 2, 10, "the cancelled response.done")
                    await asyncio.sleep(0.2)
                    after_cancel = peer.track.frames_with_audio
                    await asyncio.sleep(0.3)
                    blocks = c.kv_blocks_used()
                    client.send(type="bogus.event")
                    await client.until(lambda: "error" in client.types(), 5, "an error event")
                    return client.events, heard, after_cancel, peer.track.frames_with_audio, blocks, idle_blocks, peer
            finally:
                await client.close()
                await runner.cleanup()

    events, heard, after_cancel, later, blocks, idle_blocks, peer = asyncio.run(main())
    types = [e["type"] for e in events]
    assert types[0] == "session.created"
    first = types.index("response.done")
    assert types[:first + 1] == ["session.created", "response.created", "response.output_audio_transcript.delta",
                                 "response.output_audio.done", "response.done"]
    assert events[first]["response"]["status"] == "completed"
    assert heard > 10  # tens of 20 ms frames of (random-weight) audio reached the peer, decoded from Opus
    done = [e for e in events if e["type"] == "response.done"]
    assert done[1]["response"]["status"] == "cancelled"
    assert later == after_cancel  # no audio after the cancel: queued audio dropped
    assert blocks == idle_blocks  # the cancelled request's KV was freed
    assert "unknown event type 'bogus.event'" in events[-1]["error"]["message"]
    assert peer.ttfa_ms and peer.ttfa_ms[0] > 0


def test_signalling_refuses_garbage_oversized_unauthorised_and_too_many_peers(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            out = {}
            gateway = VoiceGateway(orpheus, c, limits=GatewayLimits(max_peers=1, max_body_bytes=4096))
            runner, url = await serve_gateway(gateway)
            client = Client()
            try:
                async with ClientSession() as http:
                    async with http.post(f"{url}/offer", json={"sdp": "v=0 garbage", "type": "offer"}) as r:
                        out["garbage"] = (r.status, await r.text())
                    async with http.post(f"{url}/offer", data=b"x" * 10000) as r:
                        out["big"] = r.status
                    async with http.post(f"{url}/offer", data=b"not json") as r:
                        out["not_json"] = (r.status, await r.text())
                    assert not gateway.peers  # a refused offer leaves no peer behind
                    await client.connect(http, url)
                    second = RTCPeerConnection(RTCConfiguration(iceServers=[]))
                    second.createDataChannel("x")
                    await second.setLocalDescription(await second.createOffer())
                    async with http.post(f"{url}/offer", json={"sdp": second.localDescription.sdp, "type": "offer"}) as r:
                        out["full"] = (r.status, await r.text())
                    await second.close()
            finally:
                await client.close()
                await runner.cleanup()
            secured = VoiceGateway(orpheus, c, host="127.0.0.1", token="s3cret")
            runner, url = await serve_gateway(secured)
            try:
                async with ClientSession() as http:
                    async with http.post(f"{url}/offer", json={}) as r:
                        out["no_token"] = r.status
                    async with http.post(f"{url}/offer", json={}, headers={"Authorization": "Bearer s3cret"}) as r:
                        out["token"] = r.status
            finally:
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["garbage"][0] == 400 and "cannot take this SDP offer" in out["garbage"][1]
    assert out["big"] == 413
    assert out["not_json"][0] == 400 and "must be JSON" in out["not_json"][1]
    assert out["full"][0] == 503 and "1 peers are connected" in out["full"][1]
    assert out["no_token"] == 401 and out["token"] == 400  # authorised, then refused for its (empty) body
    with pytest.raises(ValueError, match="give --token"):
        VoiceGateway(orpheus, None, host="0.0.0.0")


def test_v1_audio_speech_streams_the_same_audio_as_mstar_ros_tts(orpheus, tmp_path):
    import base64
    import subprocess
    import sys
    import time
    import wave

    text, seed = "Streaming speech, chunk by chunk.", 7
    out = tmp_path / "tts.wav"
    run = subprocess.run([sys.executable, "-m", "mstar_ros.cli", "-q", "tts", "--text", text, "--out", str(out),
                          "--seed", str(seed), "--max-tokens", "280"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    with wave.open(str(out)) as w:
        reference = w.readframes(w.getnframes())

    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle = c.kv_blocks_used()
            runner, url = await serve_gateway(VoiceGateway(orpheus, c))
            got = {}
            try:
                async with ClientSession() as http:
                    async with http.get(f"{url}/v1/models") as r:
                        got["models"] = await r.json()
                    arrivals, pcm = [], b""
                    started = time.monotonic()
                    async with http.post(f"{url}/v1/audio/speech", json={"input": text, "response_format": "pcm",
                                                                          "seed": seed, "max_tokens": 280}) as r:
                        got["type"] = r.headers["Content-Type"]
                        async for chunk in r.content.iter_any():
                            arrivals.append(time.monotonic() - started)
                            pcm += chunk
                    got["pcm"], got["arrivals"] = pcm, arrivals
                    async with http.post(f"{url}/v1/audio/speech", json={"input": text, "response_format": "wav",
                                                                          "seed": seed, "max_tokens": 280}) as r:
                        got["wav"] = await r.read()
                    async with http.post(f"{url}/v1/audio/speech", json={"input": text, "stream_format": "sse",
                                                                          "response_format": "pcm", "seed": seed, "max_tokens": 280}) as r:
                        events = [json.loads(line[6:]) for line in (await r.text()).splitlines() if line.startswith("data: ")]
                    got["sse"] = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
                    got["sse_last"] = events[-1]["type"]
                    async with http.post(f"{url}/v1/audio/speech", json={"input": ""}) as r:
                        got["empty"] = (r.status, (await r.json())["error"]["message"])
                    # a client that leaves mid-stream: its request is cancelled and its KV freed
                    async with http.post(f"{url}/v1/audio/speech", json={"input": "A long one. " * 20}) as r:
                        await r.content.read(2000)
                    for _ in range(100):
                        if c.kv_blocks_used() == idle and c.in_flight == 0:
                            break
                        await asyncio.sleep(0.02)
                    got["left"] = (c.kv_blocks_used(), idle, c.in_flight)
            finally:
                await runner.cleanup()
            return got

    got = asyncio.run(main())

    def same_audio(a: bytes, b: bytes) -> bool:
        """Equal samples, up to 1 LSB where float sums (two processes, or batches of other sizes) round a
        half differently."""
        x, y = np.frombuffer(a, dtype=np.int16).astype(int), np.frombuffer(b, dtype=np.int16).astype(int)
        assert len(x) == len(y) > 0, (len(x), len(y))
        diff = np.abs(x - y)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.999, (int(diff.max()), float((diff == 0).mean()))
        return True

    assert got["models"]["data"][0]["id"] == "orpheus"
    assert got["type"] == "audio/pcm"
    assert same_audio(got["pcm"], reference)  # the same request and seed: the samples of `mstar-ros tts`
    assert len(got["arrivals"]) > 1 and got["arrivals"][0] < got["arrivals"][-1] - 0.05  # streamed, not whole
    assert got["wav"][:4] == b"RIFF" and same_audio(got["wav"][44:], reference)
    assert same_audio(got["sse"], reference) and got["sse_last"] == "speech.audio.done"
    assert got["empty"][0] == 400 and "empty" in got["empty"][1]
    blocks, idle, in_flight = got["left"]
    assert blocks == idle and in_flight == 0


def test_whip_answers_201_with_a_location_to_delete(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            gateway = VoiceGateway(orpheus, c)
            runner, url = await serve_gateway(gateway)
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("audio", direction="recvonly")
            out = {}
            try:
                await pc.setLocalDescription(await pc.createOffer())
                async with ClientSession() as http:
                    async with http.post(f"{url}/whip", data=pc.localDescription.sdp,
                                         headers={"Content-Type": "application/sdp"}) as r:
                        out["status"], out["type"] = r.status, r.content_type
                        out["location"], answer = r.headers["Location"], await r.text()
                    await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
                    out["peers"] = len(gateway.peers)
                    async with http.post(f"{url}/whip", data="x", headers={"Content-Type": "text/plain"}) as r:
                        out["wrong_type"] = r.status
                    async with http.delete(f"{url}{out['location']}") as r:
                        out["deleted"] = r.status
                    out["peers_after"] = len(gateway.peers)
                    async with http.delete(f"{url}{out['location']}") as r:
                        out["again"] = r.status
            finally:
                await pc.close()
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["status"] == 201 and out["type"] == "application/sdp" and out["location"].startswith("/whip/")
    assert out["peers"] == 1 and out["wrong_type"] == 415
    assert out["deleted"] == 204 and out["peers_after"] == 0 and out["again"] == 404


def test_a_peer_that_leaves_mid_response_is_cancelled_and_an_idle_one_times_out(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle_blocks = c.kv_blocks_used()
            gateway = VoiceGateway(orpheus, c, limits=GatewayLimits(idle_timeout_s=1.0))
            runner, url = await serve_gateway(gateway)
            leaving, staying, idle = Client(), Client(), Client()
            out = {}
            try:
                async with ClientSession() as http:
                    a = await leaving.connect(http, url)
                    b = await staying.connect(http, url)
                    peer_a, peer_b = gateway.peers[a["pc_id"]], gateway.peers[b["pc_id"]]
                    leaving.send(type="response.create", text="A long answer that the peer will not wait for. " * 5)
                    staying.send(type="response.create", text="A long answer that this peer hears. " * 3)
                    await leaving.until(lambda: peer_a.track.frames_with_audio > 5, 60, "audio to the leaving peer")
                    heard_b = peer_b.track.frames_with_audio
                    await leaving.close()  # the page closes mid-response
                    left_at = asyncio.get_running_loop().time()
                    for _ in range(200):
                        if a["pc_id"] not in gateway.peers:
                            break
                        await asyncio.sleep(0.01)
                    out["gone_after_s"] = asyncio.get_running_loop().time() - left_at
                    out["gone"] = a["pc_id"] not in gateway.peers
                    await staying.until(lambda: peer_b.track.frames_with_audio > heard_b + 20, 60,
                                        "the other peer to keep streaming")
                    await staying.until(lambda: "response.done" in staying.types(), 120, "the other peer's response")
                    out["b_status"] = [e for e in staying.events if e["type"] == "response.done"][0]["response"]["status"]
                    await idle.connect(http, url)
                    n = len(gateway.peers)
                    for _ in range(100):  # the idle peers (both, now) time out after 1 s
                        if not gateway.peers:
                            break
                        await asyncio.sleep(0.05)
                    out["idle"] = (n, len(gateway.peers))
                    for _ in range(100):
                        if c.kv_blocks_used() == idle_blocks:
                            break
                        await asyncio.sleep(0.02)
                    out["blocks"] = (c.kv_blocks_used(), idle_blocks)
            finally:
                for client in (staying, idle):
                    await client.close()
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["gone"] and out["gone_after_s"] < 2.0, out
    assert out["b_status"] == "completed"
    assert out["idle"] == (2, 0)
    assert out["blocks"][0] == out["blocks"][1]
