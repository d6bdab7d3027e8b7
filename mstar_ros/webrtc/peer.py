"""One browser (or any WebRTC peer) of the gateway: its connection, its audio track, its responses.

Each peer has its own session in the runtime; every peer's requests batch in one Conductor. On
``response.create`` the text becomes the speech model's request; the graph's audio chunks go to
the peer's track as they are decoded (mstar_ros.webrtc.audio_out), and the events go out on the
data channel. ``response.cancel`` (or the peer leaving) cancels the request in the runtime: its
KV blocks are freed and the queued audio is dropped, so the next turn starts clean. The peer's
microphone goes through a VAD (mstar_ros.webrtc.audio_in): ``input_audio_buffer.speech_started`` /
``speech_stopped``, and speech over a response interrupts it (barge-in).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from mstar.conductor.request import RequestCancelled, RequestError, UnknownRequest
from mstar_ros.webrtc.audio_out import PacedAudioTrack
from mstar_ros.webrtc.events import EventError, parse_client_event, response_text, server_event

log = logging.getLogger("mstar_ros.webrtc")
MAX_TEXT_CHARS = 2000


class VoicePeer:
    def __init__(self, pc, model, conductor, *, max_text_chars: int = MAX_TEXT_CHARS,
                 silence_duration_ms: int = 500) -> None:
        self.pc, self.model, self.conductor = pc, model, conductor
        self.id = uuid.uuid4().hex[:12]
        self.session = f"webrtc:{self.id}"
        self.track = PacedAudioTrack()
        self.channel = None
        self.max_text_chars = max_text_chars
        self.response_id: str | None = None
        self._task: asyncio.Task | None = None
        self.responses = 0
        self.closed = False
        self.ttfa_ms: list[float] = []
        self.last_activity = time.monotonic()  # an event from the peer, or audio going to it
        self.silence_duration_ms = silence_duration_ms
        self.speech_events = 0
        self._listener: asyncio.Task | None = None
        pc.addTrack(self.track)

        @pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":  # the microphone
                self._listener = asyncio.ensure_future(self._listen(track))

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            self.channel = channel
            self.send("session.created", session={"id": self.session, "model": type(model).__name__,
                                                  "output_audio_format": {"type": "audio/opus", "rate": 48000}})

            @channel.on("message")
            def on_message(message) -> None:
                self.last_activity = time.monotonic()
                asyncio.ensure_future(self.on_event(message))

            @channel.on("close")
            def on_close() -> None:  # the page went away: its response and KV go now
                asyncio.ensure_future(self.close())

    def send(self, kind: str, **fields) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(server_event(kind, **fields))

    async def on_event(self, message) -> None:
        try:
            event = parse_client_event(message)
            if event.type == "response.create":
                text = response_text(event)
                if len(text) > self.max_text_chars:
                    raise EventError(f"text of {len(text)} characters is over the {self.max_text_chars} limit")
                await self.cancel_response()  # one response at a time: a new one replaces it
                voice = event.response.voice if event.response else None
                self._task = asyncio.ensure_future(self._respond(text, voice))
            elif event.type == "response.cancel":
                await self.cancel_response()
            elif event.type == "session.update":
                self.send("session.updated", session=event.session or {})
            else:
                raise EventError(f"unknown event type {event.type!r}")
        except (EventError, ValueError) as exc:
            self.send("error", error={"type": "invalid_request_error", "message": str(exc)})

    async def _respond(self, text: str, voice: str | None) -> None:
        rid = f"resp_{uuid.uuid4().hex[:12]}"
        self.response_id = rid
        self.responses += 1
        audio_port = self.model.audio_output
        try:
            request = self.model.request(text, voice=voice, sampling=None,  # the model's own defaults
                                         request_id=rid, outputs=frozenset({audio_port}))
        except ValueError as exc:
            self.response_id = None
            self.send("error", error={"type": "invalid_request_error", "message": str(exc)})
            return
        started = time.monotonic()
        self.send("response.created", response={"id": rid, "status": "in_progress"})
        self.send("response.output_audio_transcript.delta", response_id=rid, delta=text)
        self.track.begin()
        status = "completed"
        try:
            async for out in self.conductor.submit(request):
                if out.name == audio_port:
                    self.track.push(out.data, self.model.sample_rate)
            self.track.end()
            while self.track.queued_ms > 0 and not self.closed:  # done when the peer has heard it
                await asyncio.sleep(0.02)
            self.send("response.output_audio.done", response_id=rid)
        except (RequestCancelled, asyncio.CancelledError):
            status = "cancelled"
        except RequestError as exc:
            status = "failed"
            self.send("error", error={"type": "server_error", "message": str(exc)})
        finally:
            if self.track.first_audio_at is not None:
                self.ttfa_ms.append((self.track.first_audio_at - started) * 1000)
            if self.response_id == rid:
                self.response_id = None
            self.send("response.done", response={"id": rid, "status": status})

    async def _listen(self, track) -> None:
        """The peer's microphone through the VAD: speech events, and barge-in when it speaks over a response."""
        from aiortc.mediastreams import MediaStreamError

        from mstar_ros.webrtc.audio_in import SpeechDetector

        detector = SpeechDetector(self.silence_duration_ms)
        while not self.closed:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            for event in detector.feed(frame):
                self.speech_events += 1
                self.last_activity = time.monotonic()
                if event.kind == "started":
                    self.send("input_audio_buffer.speech_started", audio_start_ms=event.ms)
                    if self.response_id is not None or self.track.queued_ms > 0:
                        await self.cancel_response()  # barge-in: the user speaks over the response
                else:
                    self.send("input_audio_buffer.speech_stopped", audio_end_ms=event.ms)

    async def cancel_response(self) -> None:
        """Barge-in: the request is cancelled in the runtime (its KV freed) and queued audio dropped."""
        rid, task = self.response_id, self._task
        self.track.clear()
        if rid is not None:
            try:
                await self.conductor.cancel(rid)
            except UnknownRequest:
                pass  # it had finished
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self.track.clear()

    @property
    def idle_s(self) -> float:
        busy = self.response_id is not None or self.track.queued_ms > 0
        return 0.0 if busy else time.monotonic() - self.last_activity

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._listener is not None:
            self._listener.cancel()
        await self.cancel_response()
        self.conductor.close_session(self.session)
        self.track.stop()
        await self.pc.close()
