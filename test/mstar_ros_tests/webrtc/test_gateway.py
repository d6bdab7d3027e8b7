"""The voice gateway with real aiortc peers on loopback: signalling, audio out, events, barge-in, limits."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import numpy as np
import pytest
from aiohttp import ClientSession
from aiortc import RTCConfiguration, RTCPeerConnection

from mstar.conductor import Conductor
from mstar_ros.webrtc.client import GatewayClient
from mstar_ros.webrtc.server import GatewayLimits, VoiceGateway
from support.vanishing_peer import VANISHING_PEER
from support.webrtc_gateway import serve_gateway


@pytest.mark.slow
def test_a_peer_hears_the_response_and_gets_its_events_then_barges_in(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle_blocks = c.kv_blocks_used()
            gateway = VoiceGateway(orpheus, c)
            runner, url = await serve_gateway(gateway)
            client = GatewayClient()
            try:
                async with ClientSession() as http:
                    answer = await client.connect(http, url)
                    assert answer["type"] == "answer" and answer["pc_id"] in gateway.peers
                    await client.until(lambda: "session.created" in client.types(), 10, "session.created")
                    client.send(type="response.create", response={"instructions": "Hello there, how are you?"})
                    await client.until(lambda: "output_audio_buffer.stopped" in client.types(), 60, "the audio's end")
                    heard = client.loud_frames()
                    peer = gateway.peers[answer["pc_id"]]
                    # barge-in: a long response, cancelled once audio flows
                    client.send(type="response.create", text="This is a long sentence that goes on " * 6)
                    await client.until(
                        lambda: peer.track.frames_with_audio > heard + 5, 60, "the second response's audio"
                    )
                    client.send(type="response.cancel")
                    await client.until(
                        lambda: client.types().count("response.done") == 2, 10, "the cancelled response.done"
                    )
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
    # OpenAI's order: the response, its item and part, the audio starting, the deltas, the done events; the
    # audio buffer stops once the peer has heard it all, after response.done
    assert types[: first + 2] == [
        "session.created",
        "response.created",
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.output_audio_transcript.delta",
        "output_audio_buffer.started",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
        "output_audio_buffer.stopped",
    ], types
    assert events[first]["response"]["status"] == "completed"
    assert heard > 10  # tens of 20 ms frames of (random-weight) audio reached the peer, decoded from Opus
    done = [e for e in events if e["type"] == "response.done"]
    assert done[1]["response"]["status"] == "cancelled"
    assert later == after_cancel  # no audio after the cancel: queued audio dropped
    second = [e for e in events if e.get("response_id") == done[1]["response"]["id"]]
    assert [e["type"] for e in second if e["type"].startswith("output_audio_buffer")] == [
        "output_audio_buffer.started",
        "output_audio_buffer.cleared",
    ]
    assert blocks == idle_blocks  # the cancelled request's KV was freed
    assert "unknown event type 'bogus.event'" in events[-1]["error"]["message"]
    assert events[-1]["error"]["param"] == "type" and events[-1]["error"]["type"] == "invalid_request_error"
    timing = peer.timings[0]
    assert timing.status == "completed" and timing.received < timing.first_chunk <= timing.first_frame


def test_session_update_sets_the_sampling_and_length_of_later_responses(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            gateway = VoiceGateway(orpheus, c)
            runner, url = await serve_gateway(gateway)
            client = GatewayClient()
            try:
                async with ClientSession() as http:
                    answer = await client.connect(http, url)
                peer = gateway.peers[answer["pc_id"]]
                client.send(type="session.update", session={"top_p": 2.0})
                await client.until(lambda: "error" in client.types(), 5, "the refusal")
                client.send(
                    type="session.update",
                    session={
                        "max_output_tokens": 49,
                        "seed": 5,
                        "temperature": 0.5,
                        "turn_detection": {"silence_duration_ms": 700},
                    },
                )
                await client.until(lambda: "session.updated" in client.types(), 5, "session.updated")
                audio = []
                for _ in range(2):  # same seed, same sampling: the same audio, at most 49 tokens of it
                    n = client.types().count("response.done")
                    client.send(type="response.create", text="Say something rather long, please, for a while.")
                    await client.until(lambda n=n: client.types().count("response.done") == n + 1, 60, "response.done")
                    audio.append(peer.timings[-1].audio_s)
                client.send(type="response.create", response={"instructions": "Shorter.", "max_output_tokens": 14})
                await client.until(lambda: client.types().count("response.done") == 3, 60, "response.done")
                audio.append(peer.timings[-1].audio_s)
                client.send(type="response.create", response={"instructions": "Too long.", "max_output_tokens": 10**6})
                await client.until(lambda: client.types().count("error") == 2, 5, "the refusal")
                return client.events, audio
            finally:
                await client.close()
                await runner.cleanup()

    events, audio = asyncio.run(main())
    errors = [e["error"]["message"] for e in events if e["type"] == "error"]
    assert "sampling.top_p = 2.0 must be in (0, 1]" in errors[0]
    assert "max_output_tokens = 1000000 must be in [1, " in errors[1]
    session = [e for e in events if e["type"] == "session.updated"][0]["session"]
    assert (session["max_output_tokens"], session["seed"], session["temperature"]) == (49, 5, 0.5)
    assert session["top_p"] == orpheus.default_sampling.top_p  # the refused update changed nothing
    assert session["turn_detection"]["silence_duration_ms"] == 700
    frame_s = 2048 / orpheus.sample_rate  # 7 tokens per SNAC frame of 2048 samples
    assert 0 < audio[0] == audio[1] <= 7 * frame_s + 1e-9
    assert 0 < audio[2] <= 2 * frame_s + 1e-9


def test_signalling_refuses_garbage_oversized_unauthorised_and_too_many_peers(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            out = {}
            gateway = VoiceGateway(orpheus, c, limits=GatewayLimits(max_peers=1, max_body_bytes=4096))
            runner, url = await serve_gateway(gateway)
            client = GatewayClient()
            try:
                async with ClientSession() as http:
                    async with http.post(f"{url}/offer", json={"sdp": "v=0 garbage", "type": "offer"}) as r:
                        out["garbage"] = (r.status, await r.text())
                    async with http.post(f"{url}/offer", data=b"x" * 10000) as r:
                        out["big"] = r.status
                    async with http.post(f"{url}/offer", data=b"not json") as r:
                        out["not_json"] = (r.status, await r.text())
                    for route in ("/offer", "/v1/audio/speech"):  # msgspec and json recurse as deep as the input
                        async with http.post(f"{url}{route}", data=b'{"input": "hi", "x": ' + b"[" * 3000) as r:
                            out[f"nested {route}"] = r.status
                    out["chunked"] = await raw_status(
                        url, b"POST /offer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", chunks=15 * 16
                    )
                    assert not gateway.peers  # a refused offer leaves no peer behind
                    await client.connect(http, url)
                    second = RTCPeerConnection(RTCConfiguration(iceServers=[]))
                    second.createDataChannel("x")
                    await second.setLocalDescription(await second.createOffer())
                    async with http.post(
                        f"{url}/offer", json={"sdp": second.localDescription.sdp, "type": "offer"}
                    ) as r:
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
                    async with http.post(f"{url}/offer", json={}, headers={"Authorization": "bearer s3cret"}) as r:
                        out["lower_case"] = r.status
                    async with http.post(f"{url}/offer", json={}, headers={"Authorization": "s3cret"}) as r:
                        out["no_scheme"] = r.status
                out["latin1"] = await raw_status(
                    url, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cr\xe9t\r\n\r\n"
                )
            finally:
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["garbage"][0] == 400 and "cannot take this SDP offer" in out["garbage"][1]
    assert out["big"] == 413
    assert out["not_json"][0] == 400 and "must be JSON" in out["not_json"][1]
    assert out["nested /offer"] == out["nested /v1/audio/speech"] == 400  # not a 500 (RecursionError)
    assert out["chunked"] == (413, True)  # refused within the first MiB of 15, not once read whole
    assert out["full"][0] == 503 and "1 peers are connected" in out["full"][1]
    assert out["no_token"] == 401 and out["token"] == 400  # authorised, then refused for its (empty) body
    assert out["lower_case"] == 400 and out["no_scheme"] == 401 and out["latin1"][0] == 401
    with pytest.raises(ValueError, match="give a token"):
        VoiceGateway(orpheus, None, host="0.0.0.0")


async def raw_status(url: str, head: bytes, chunks: int = 0) -> tuple[int, bool]:
    """(the status line's code, whether it came before the client had sent 1 MiB) for a request written raw:
    ``head``, then up to ``chunks`` chunked 64 KiB pieces of body until the answer comes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    answer = asyncio.ensure_future(reader.readline())
    sent = 0
    for _ in range(chunks):
        try:
            writer.write(b"10000\r\n" + b"x" * 65536 + b"\r\n")
            await writer.drain()
        except ConnectionError:
            break
        sent += 65536
        await asyncio.sleep(0.002)
        if answer.done():
            break
    line = await asyncio.wait_for(answer, 10)
    writer.close()
    return (int(line.split()[1]) if line else 0), sent < 2**20


def test_offers_that_never_connect_give_their_slots_to_newer_offers_and_go_after_the_connect_timeout(orpheus):
    """A client that posts offers and never does ICE holds a slot only until a newer offer needs it (the oldest
    pending one goes: per address, in all, or when the house is full) and for ``connect_timeout_s`` at most: a
    burst of them cannot lock a real peer out."""

    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            gateway = VoiceGateway(
                orpheus,
                c,
                limits=GatewayLimits(max_peers=3, max_pending_peers=2, max_pending_per_client=2, connect_timeout_s=1.5),
            )
            runner, url = await serve_gateway(gateway)
            out = {}
            try:
                async with ClientSession() as http:

                    async def ghost() -> tuple[int, str]:
                        client = GatewayClient(keep_samples=False)
                        await client.pc.setLocalDescription(await client.pc.createOffer())
                        async with http.post(
                            f"{url}/offer", json={"sdp": client.pc.localDescription.sdp, "type": "offer"}
                        ) as r:
                            answer = (r.status, await r.json() if r.status == 200 else await r.text())
                        await client.close()  # never does ICE with the answer
                        return answer

                    ghosts = [await ghost() for _ in range(5)]
                    out["ghosts"] = [s for s, _ in ghosts]
                    out["pending"] = sorted(gateway.pending) == sorted(a["pc_id"] for _, a in ghosts[-2:])
                    real = GatewayClient(keep_samples=False)
                    try:
                        out["real"] = (await real.connect(http, url))["pc_id"] in gateway.peers  # no waiting
                        started = time.monotonic()
                        while gateway.pending and time.monotonic() - started < 10:
                            await asyncio.sleep(0.05)
                        out["ghost_left_after_s"] = time.monotonic() - started
                        out["peers"] = len(gateway.peers)
                        others = [GatewayClient(keep_samples=False) for _ in range(3)]
                        out["full"] = []
                        for other in others:
                            try:
                                await other.connect(http, url)
                                out["full"].append("connected")
                            except ConnectionError as exc:
                                out["full"].append(str(exc))
                        for other in others:
                            await other.close()
                    finally:
                        await real.close()
            finally:
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["ghosts"] == [200] * 5 and out["pending"], out  # the two newest wait; the older three went
    assert out["real"], out
    assert out["ghost_left_after_s"] < 3.5 and out["peers"] == 1, out  # 1.5 s connect timeout
    assert out["full"][:2] == ["connected", "connected"], out
    assert "503" in out["full"][2] and "3 peers are connected" in out["full"][2], out


@pytest.mark.slow
def test_v1_audio_speech_streams_the_same_audio_as_mstar_ros_tts(orpheus, tmp_path):
    import base64
    import subprocess
    import sys
    import time
    import wave

    text, seed = "Streaming speech, chunk by chunk.", 7
    out = tmp_path / "tts.wav"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mstar_ros.cli",
            "-q",
            "tts",
            "--text",
            text,
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--max-tokens",
            "280",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
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
                    async with http.post(
                        f"{url}/v1/audio/speech",
                        json={"input": text, "response_format": "pcm", "seed": seed, "max_tokens": 280},
                    ) as r:
                        got["type"] = r.headers["Content-Type"]
                        async for chunk in r.content.iter_any():
                            arrivals.append(time.monotonic() - started)
                            pcm += chunk
                    got["pcm"], got["arrivals"] = pcm, arrivals
                    async with http.post(
                        f"{url}/v1/audio/speech",
                        json={"input": text, "response_format": "wav", "seed": seed, "max_tokens": 280},
                    ) as r:
                        got["wav"] = await r.read()
                    async with http.post(
                        f"{url}/v1/audio/speech",
                        json={
                            "input": text,
                            "stream_format": "sse",
                            "response_format": "pcm",
                            "seed": seed,
                            "max_tokens": 280,
                        },
                    ) as r:
                        events = [
                            json.loads(line[6:]) for line in (await r.text()).splitlines() if line.startswith("data: ")
                        ]
                    got["sse"] = b"".join(
                        base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
                    )
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
        """Equal samples, up to 1 LSB where float sums (two processes, batches of other sizes, another intra-op
        thread count) round a half differently: float32 noise of ~1e-7..1e-6 moves a sample across a rounding
        edge in ~0.1-1% of samples (measured: 0.16% under a concurrent test run)."""
        x, y = np.frombuffer(a, dtype=np.int16).astype(int), np.frombuffer(b, dtype=np.int16).astype(int)
        assert len(x) == len(y) > 0, (len(x), len(y))
        diff = np.abs(x - y)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99, (int(diff.max()), float((diff == 0).mean()))
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


@pytest.mark.slow
def test_a_peer_that_leaves_mid_response_is_cancelled_and_idle_ones_time_out(orpheus):
    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle_blocks = c.kv_blocks_used()
            gateway = VoiceGateway(orpheus, c, limits=GatewayLimits(idle_timeout_s=1.0))
            runner, url = await serve_gateway(gateway)
            leaving, staying, idle = GatewayClient(), GatewayClient(), GatewayClient()
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
                    await staying.until(
                        lambda: peer_b.track.frames_with_audio > heard_b + 20, 60, "the other peer to keep streaming"
                    )
                    await staying.until(
                        lambda: "output_audio_buffer.stopped" in staying.types(),
                        120,
                        "the other peer's response, heard to its end",
                    )
                    out["b_status"] = [e for e in staying.events if e["type"] == "response.done"][0]["response"][
                        "status"
                    ]
                    c_id = (await idle.connect(http, url))["pc_id"]
                    out["idle_served"] = "session.created" in idle.types()
                    for _ in range(200):  # both idle peers time out after 1 s without an event or audio
                        if b["pc_id"] not in gateway.peers and c_id not in gateway.peers:
                            break
                        await asyncio.sleep(0.05)
                    out["idle_left"] = [p for p in (b["pc_id"], c_id) if p in gateway.peers]
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
    assert out["idle_served"] and out["idle_left"] == [], out
    assert out["blocks"][0] == out["blocks"][1]


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_peer_that_vanishes_mid_stream_is_dropped_within_2_s_and_the_others_keep_streaming(orpheus):
    """The peer's process is killed (no goodbye on the wire): ICE consent checks (RFC 7675) stop being
    answered and the gateway drops it, cancelling its request and freeing its KV, in under 2 s."""

    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle_blocks = c.kv_blocks_used()
            gateway = VoiceGateway(orpheus, c)
            runner, url = await serve_gateway(gateway)
            staying = GatewayClient()
            proc = subprocess.Popen([sys.executable, "-c", VANISHING_PEER, url], stdout=subprocess.PIPE)
            loop = asyncio.get_running_loop()
            out = {}
            try:
                async with ClientSession() as http:
                    await staying.connect(http, url)
                pc_id = (await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), 90)).decode().strip()
                assert pc_id, "the vanishing peer did not connect"
                vanishing = gateway.peers[pc_id]
                out["streaming"] = vanishing.response_id is not None
                staying.send(type="response.create", text="A long answer that this peer hears. " * 4)
                await staying.until(lambda: staying.loud_frames() > 5, 60, "audio to the staying peer")
                proc.kill()
                killed_at = time.monotonic()
                proc.wait()
                while pc_id in gateway.peers and time.monotonic() - killed_at < 10:
                    await asyncio.sleep(0.01)
                out["dropped_after_s"] = time.monotonic() - killed_at
                heard = staying.loud_frames()
                await staying.until(lambda: staying.loud_frames() > heard + 20, 60, "the staying peer to keep hearing")
                await staying.until(lambda: "response.done" in staying.types(), 120, "the staying peer's response")
                out["status"] = [e for e in staying.events if e["type"] == "response.done"][0]["response"]["status"]
                await staying.close()
                for _ in range(200):
                    if c.kv_blocks_used() == idle_blocks:
                        break
                    await asyncio.sleep(0.02)
                out["blocks"] = (c.kv_blocks_used(), idle_blocks)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                await staying.close()
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["streaming"], out
    assert out["dropped_after_s"] < 2.0, out
    assert out["status"] == "completed", out
    assert out["blocks"][0] == out["blocks"][1], out
