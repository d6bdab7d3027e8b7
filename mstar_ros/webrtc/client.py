"""A WebRTC peer of the gateway as a browser is one, on aiortc: the benchmark's peers and the tests' clients.

It offers a data channel (``oai-events``) for the Realtime-API events, receives the gateway's audio
track, and may send a microphone track. Each decoded 20 ms frame is kept with its arrival time, so a
caller can tell when the first audible frame of a response came (time to first audio at the peer).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HeardFrame:
    at: float  # time.monotonic() the decoded frame came out of the peer's receiver
    loud: bool  # any sample not zero (the gateway sends digital silence between responses)


class GatewayClient:
    def __init__(self, microphone=None, keep_samples: bool = True, jitter_prefetch: int | None = None) -> None:
        """``jitter_prefetch``: frames aiortc's audio receiver holds before it decodes the oldest (its default
        is a fixed 4, i.e. 80 ms; a browser's adaptive buffer holds ~1-2 on a jitter-free loopback)."""
        from aiortc import RTCConfiguration, RTCPeerConnection

        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict] = []
        self.event_times: list[float] = []
        self.opened = asyncio.Event()
        self.heard: list[HeardFrame] = []
        self.frames: list[np.ndarray] = []
        self.keep_samples = keep_samples
        if microphone is not None:
            self.pc.addTrack(microphone)
            self.pc.getTransceivers()[-1].direction = "sendrecv"
        else:
            self.pc.addTransceiver("audio", direction="recvonly")
        self.channel.on("open", self.opened.set)
        self.channel.on("message", self._on_message)
        self.pc.on("track", self._on_track)
        if jitter_prefetch is not None:
            from aiortc.jitterbuffer import JitterBuffer

            for receiver in self.pc.getReceivers():  # aiortc has no option for it
                receiver._RTCRtpReceiver__jitter_buffer = JitterBuffer(capacity=16, prefetch=jitter_prefetch)
        self._reader: asyncio.Task | None = None

    def _on_message(self, message: str) -> None:
        self.events.append(json.loads(message))
        self.event_times.append(time.monotonic())

    def _on_track(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        async def read() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return
                samples = frame.to_ndarray().reshape(-1)
                self.heard.append(HeardFrame(time.monotonic(), bool(np.abs(samples).max() > 0)))
                if self.keep_samples:
                    self.frames.append(samples)

        self._reader = asyncio.ensure_future(read())

    async def connect(self, http, url: str, timeout: float = 20.0, token: str | None = None) -> dict:
        """POST /offer with aiohttp session ``http``; returns the answer (with its ``pc_id``) once the channel is open."""
        from aiortc import RTCSessionDescription

        await self.pc.setLocalDescription(await self.pc.createOffer())
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with http.post(
            f"{url}/offer", json={"sdp": self.pc.localDescription.sdp, "type": "offer"}, headers=headers
        ) as r:
            if r.status != 200:
                raise ConnectionError(f"/offer answered {r.status}: {await r.text()}")
            answer = await r.json()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        await asyncio.wait_for(self.opened.wait(), timeout)
        return answer

    def send(self, **event) -> None:
        self.channel.send(json.dumps(event))

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def first_loud_after(self, t: float) -> float | None:
        """When the first audible frame arriving after ``t`` came, or None."""
        return next((f.at for f in self.heard if f.at > t and f.loud), None)

    async def until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}; events {self.types()}")
            await asyncio.sleep(0.01)

    def loud_frames(self) -> int:
        return sum(f.loud for f in self.heard)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()
