"""A peer's microphone through the VAD: real speech (espeak-ng) over a response interrupts it (barge-in)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import ClientSession
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer

from mstar.conductor import Conductor
from mstar_ros.webrtc.server import VoiceGateway
from support.speech_wav import SILENCE_BEFORE_S
from support.webrtc_gateway import serve_gateway


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_speech_over_a_response_interrupts_it_and_the_turn_ends_after_the_silence(orpheus, speech_wav):
    path, speech_s = speech_wav

    async def main():
        async with Conductor(orpheus.graph(), orpheus.modules()) as c:
            idle = c.kv_blocks_used()
            gateway = VoiceGateway(orpheus, c)
            runner, url = await serve_gateway(gateway)
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            player = MediaPlayer(str(path))
            pc.addTrack(player.audio)
            channel = pc.createDataChannel("oai-events")
            events, opened = [], asyncio.Event()
            channel.on("open", opened.set)
            channel.on("message", lambda m: events.append((asyncio.get_running_loop().time(), json.loads(m))))
            try:
                await pc.setLocalDescription(await pc.createOffer())
                async with ClientSession() as http:
                    async with http.post(f"{url}/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r:
                        answer = await r.json()
                await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
                await asyncio.wait_for(opened.wait(), 20)
                channel.send(json.dumps({"type": "response.create", "text": "A long reply the user talks over. " * 4}))
                for _ in range(600):
                    if any(e["type"] == "input_audio_buffer.speech_stopped" for _, e in events):
                        break
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)
                return events, c.kv_blocks_used(), idle
            finally:
                player.audio.stop()
                await pc.close()
                await runner.cleanup()

    events, blocks, idle = asyncio.run(main())
    types = [e["type"] for _, e in events]
    assert "input_audio_buffer.speech_started" in types and "input_audio_buffer.speech_stopped" in types, types
    started = next(e for _, e in events if e["type"] == "input_audio_buffer.speech_started")
    stopped = next(e for _, e in events if e["type"] == "input_audio_buffer.speech_stopped")
    # where the speech is in the microphone's audio (the VAD pads its edges by ~30 ms)
    assert abs(started["audio_start_ms"] - SILENCE_BEFORE_S * 1000) < 400, started
    assert stopped["audio_end_ms"] > started["audio_start_ms"] + 0.5 * speech_s * 1000, stopped
    # the response was interrupted by the speech, not finished
    done = [e for _, e in events if e["type"] == "response.done"]
    assert done and done[0]["response"]["status"] == "cancelled", types
    assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
    assert blocks == idle
