"""One browser (or any WebRTC peer) of the gateway: its connection, its audio track, its responses.

Each peer has its own session in the runtime; every peer's requests batch in one Conductor. On
``response.create`` the text becomes the speech model's request; the graph's audio chunks go to
the peer's track as they are decoded (mstar_ros.webrtc.audio_out), and the events go out on the
data channel. ``response.cancel`` (or the peer leaving) cancels the request in the runtime: its
KV blocks are freed and the queued audio is dropped, so the next turn starts clean. The peer's
microphone goes through a VAD (mstar_ros.webrtc.audio_in): ``input_audio_buffer.speech_started`` /
``speech_stopped``, and speech over a response interrupts it (barge-in). For a model that answers
speech, a turn's audio goes to the graph: streamed into its request while the turn is said when the
model has ``listen_request`` (the graph's streamed input), else as one clip when the turn ends.
``conversation.item.create`` adds a message (text, and images for a model that takes them) to the
conversation the model sees on its next turn (mstar_ros.webrtc.conversation_items).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

import msgspec

from mstar.conductor.request import RequestCancelled, RequestError, UnknownRequest
from mstar_ros.webrtc.audio_out import PacedAudioTrack
from mstar_ros.webrtc.budget import BudgetBusy, SharedBudget
from mstar_ros.webrtc.conversation_items import conversation_item, image_pixels, turn_images
from mstar_ros.webrtc.events import EventError, SessionUpdate, parse_client_event, response_text, server_event
from mstar_ros.webrtc.media_parts import MAX_REQUEST_IMAGE_PIXELS, load_image, pixels

log = logging.getLogger("mstar_ros.webrtc")
MAX_TEXT_CHARS = 2000


@dataclass
class StreamedTurn:
    """A spoken turn whose samples stream into its request while it is said."""
    request: object
    stream: object   # its SampleStream: push samples, close at the turn's end
    ended: asyncio.Future  # the time (time.monotonic()) the turn ended
    pieces: list = field(default_factory=list)  # the samples that went in: the turn the conversation keeps
    failed: bool = False   # its stream failed (over the limit): the rest of the turn is dropped
    streamed_before_end: int = 0  # samples that went in while the user was still speaking

    @property
    def audio(self):
        import numpy as np

        return np.concatenate(self.pieces) if self.pieces else None


@dataclass
class ResponseTiming:
    """One response's times (time.monotonic()): what the benchmark splits into model time and gateway overhead."""
    response_id: str
    received: float                   # response.create came off the data channel
    first_chunk: float | None = None  # the graph's first audio chunk came out of the Conductor
    first_frame: float | None = None  # the first audible 20 ms frame went to the encoder
    last_chunk: float | None = None
    audio_s: float = 0.0              # seconds of audio the graph produced
    underruns: int = 0                # silent frames sent mid-utterance (the model fell behind)
    status: str = "in_progress"

    @property
    def model_ttfa_ms(self) -> float | None:
        return None if self.first_chunk is None else (self.first_chunk - self.received) * 1000

    @property
    def rtf(self) -> float | None:
        """Generation time over audio time (< 1: the model keeps ahead of real time)."""
        if self.last_chunk is None or not self.audio_s:
            return None
        return (self.last_chunk - self.received) / self.audio_s


class VoicePeer:
    def __init__(self, pc, model, conductor, *, max_text_chars: int = MAX_TEXT_CHARS,
                 silence_duration_ms: int = 500, decode_budget: SharedBudget | None = None) -> None:
        self.pc, self.model, self.conductor = pc, model, conductor
        # pixels of images being decoded at once, shared with the gateway's other peers and routes
        self.decode_budget = decode_budget or SharedBudget(MAX_REQUEST_IMAGE_PIXELS, "pixels of images being decoded")
        self.id = uuid.uuid4().hex[:12]
        self.session = f"webrtc:{self.id}"
        self.track = PacedAudioTrack()
        self.channel = None
        self.max_text_chars = max_text_chars
        self.response_id: str | None = None
        self._task: asyncio.Task | None = None
        self.responses = 0
        self.closed = False
        self.timings: list[ResponseTiming] = []
        self.last_activity = time.monotonic()  # an event from the peer, or audio going to it
        self.silence_duration_ms = silence_duration_ms
        self.speech_events = 0
        self.voice: str | None = None
        # a conversational model's earlier turns: (role, text), and a spoken one's audio (role, text, samples)
        self.history: list[tuple] = []
        self.conversational = bool(getattr(model, "conversational", False))
        self.listens = self.conversational and getattr(model, "audio_input_rate", None) is not None
        self.streams_turns = self.listens and hasattr(model, "listen_request")
        self.takes_images = self.conversational and bool(getattr(model, "image_input", False))
        self._in_order = asyncio.Lock()  # the peer's events take effect in the order they came
        self.turn: StreamedTurn | None = None  # the spoken turn streaming in now
        self.last_turn: StreamedTurn | None = None
        self.sampling = model.default_sampling  # session.update changes it for the peer's later responses
        self._listener: asyncio.Task | None = None
        self._switch = asyncio.Lock()  # one response replaces another at a time (typed text, speech)
        pc.addTrack(self.track)

        @pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":  # the microphone
                self._listener = asyncio.ensure_future(self._listen(track))

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            self.channel = channel
            self.send("session.created", session={**self.session_state(), "model": type(model).__name__,
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
        async with self._in_order:  # an item decoding its image is in the conversation before a later response.create
            if not self.closed:     # events queued behind a slow one are dropped once the peer has gone
                await self._on_event(message)

    async def _on_event(self, message) -> None:
        try:
            event = parse_client_event(message)
            if event.type == "response.create":
                text = response_text(event, required=not self.conversational)
                if text is not None and len(text) > self.max_text_chars:
                    raise EventError(f"text of {len(text)} characters is over the {self.max_text_chars} limit")
                spec = event.response
                sampling = self.sampling
                if spec is not None and spec.max_output_tokens is not None:
                    sampling = self._sampling_with(max_tokens=spec.max_output_tokens)
                received = time.monotonic()
                voice = (spec.voice if spec else None) or self.voice
                answers_item = self.conversational and text is None
                if answers_item:
                    self._split_last_item()  # refused here, before the response playing now is cancelled
                async with self._switch:
                    await self.cancel_response()  # one response at a time: a new one replaces it
                    # the conversation as it is now: a response that ended during the cancel is in it
                    history, item = self._split_last_item() if answers_item else (list(self.history), None)
                    self._task = asyncio.ensure_future(self._respond(text, voice, sampling, received,
                                                                     history=history, item=item))
            elif event.type == "conversation.item.create":
                if not self.conversational:
                    raise EventError("this model keeps no conversation: it speaks the text of response.create")
                # decoding, preparing and checking it against the conversation is CPU work: off the loop;
                # its images are judged from their headers first, and decoded once their pixels are reserved
                added = await asyncio.to_thread(self._opened_item, event.item, list(self.history))
                async with self.decode_budget.reserve(pixels(added.images)):
                    turn = await asyncio.to_thread(self._checked_item, added, list(self.history))
                if self.closed:
                    return
                self.history = self._trimmed(self.history + [turn])
                self.send("conversation.item.created", item=added.summary())
            elif event.type == "input_audio_buffer.commit":
                raise EventError("the turn ends on its own here (server VAD): speak, then pause")
            elif event.type == "response.cancel":
                await self.cancel_response()
            elif event.type == "session.update":
                self.update_session(event.session or SessionUpdate())
            else:
                raise EventError(f"unknown event type {event.type!r}")
        except (EventError, ValueError, BudgetBusy) as exc:
            self.send("error", error={"type": "invalid_request_error", "message": str(exc)})

    def _split_last_item(self) -> tuple[list, tuple]:
        """(the turns before it, the conversation's last item): the user's turn a text-less response.create answers."""
        if not self.history or self.history[-1][0] != "user":
            raise EventError("response.create needs text, or a user item to answer "
                             "(conversation.item.create) as the conversation's last")
        return list(self.history[:-1]), self.history[-1]

    def _opened_item(self, raw, history: list):
        """The item, checked, its images opened (headers only) and judged against the model's room with the
        conversation's: nothing decoded yet."""
        added = conversation_item(raw, f"item_{uuid.uuid4().hex[:12]}", images_ok=self.takes_images,
                                  pixels_left=self.MAX_HISTORY_IMAGE_PIXELS)
        check_images = getattr(self.model, "check_images", None)
        if added.images and check_images is not None:
            check_images([image for turn in history for image in turn_images(turn)] + added.images)
        return added

    def _checked_item(self, added, history: list) -> tuple:
        """The item's history turn: its images decoded and prepared once for every later turn (when the model
        can), and refused unless the model takes the conversation with it (a text that makes a special token,
        images over the context): an item that joins the conversation never breaks a later turn."""
        for image in added.images:
            load_image(image)
        prepare = getattr(self.model, "prepare_image", None)
        if added.images and prepare is not None:
            added.prepared = [prepare(image) for image in added.images]
        turn = added.history_turn()
        last = turn if added.role == "user" else ("user", "and?")  # any request ends with a user turn
        before = history + ([] if added.role == "user" else [turn])
        self.model.request(last[1] or None, images=turn_images(last), history=before, sampling=self.sampling)
        return turn

    def _sampling_with(self, **changes):
        """The session's sampling with ``changes``; a bad value is an error naming the field."""
        limit = self.model.default_sampling.max_tokens
        tokens = changes.get("max_tokens")
        if tokens is not None and not 1 <= tokens <= limit:
            raise EventError(f"max_output_tokens = {tokens} must be in [1, {limit}]")
        return msgspec.structs.replace(self.sampling, **changes)  # SamplingParams checks the rest

    def update_session(self, update: SessionUpdate) -> None:
        changes = {name: getattr(update, field) for field, name in
                   (("temperature", "temperature"), ("top_p", "top_p"), ("repetition_penalty", "repetition_penalty"),
                    ("seed", "seed"), ("max_output_tokens", "max_tokens")) if getattr(update, field) is not None}
        sampling = self._sampling_with(**changes)
        silence = update.turn_detection.silence_duration_ms if update.turn_detection else None
        if silence is not None and not 100 <= silence <= 10_000:
            raise EventError(f"turn_detection.silence_duration_ms = {silence} must be in [100, 10000]")
        self.sampling = sampling
        self.voice = update.voice or self.voice
        if silence is not None:
            self.silence_duration_ms = silence  # from the next microphone track on
        self.send("session.updated", session=self.session_state())

    def session_state(self) -> dict:
        s = self.sampling
        return {"id": self.session, "voice": self.voice, "max_output_tokens": s.max_tokens,
                "input_image": self.takes_images,  # conversation.item.create takes input_image parts
                "temperature": s.temperature, "top_p": s.top_p, "repetition_penalty": s.repetition_penalty,
                "seed": s.seed, "turn_detection": {"type": "server_vad", "silence_duration_ms": self.silence_duration_ms}}

    async def _respond(self, text: str | None, voice: str | None, sampling, received: float,
                       audio=None, turn: StreamedTurn | None = None, history: list | None = None,
                       item: tuple | None = None) -> None:
        """``item``: the conversation's last user item, answered (its turn), ``history`` the turns before it."""
        rid = turn.request.request_id if turn is not None else f"resp_{uuid.uuid4().hex[:12]}"
        self.response_id = rid
        model, audio_port = self.model, self.model.audio_output
        text_port = getattr(model, "text_output", None) if self.conversational else None
        if turn is not None:  # the request runs from the turn's start; the response starts at its end
            outputs = self.conductor.submit(turn.request)
            try:
                received = await turn.ended
            except asyncio.CancelledError:  # cancelled while the turn went on: its request goes too
                if not turn.stream.closed:
                    turn.stream.fail("the turn's response was cancelled")
                if self.response_id == rid:
                    self.response_id = None
                raise
            heard = turn.audio
            await self._stream_response(rid, text, text_port, audio_port, received, outputs,
                                        ("user", "") if heard is None else ("user", "", heard))
            return
        try:
            if self.conversational:  # a turn of the conversation: the model answers it
                history = list(self.history) if history is None else history
                images = []
                if item is not None:
                    text, images = item[1], turn_images(item)
                request = model.request(text, audio=audio, images=images, history=history, voice=voice,
                                        sampling=sampling, request_id=rid,
                                        outputs=frozenset({audio_port, text_port} - {None}))
            else:  # a text-to-speech model speaks the text itself
                request = model.request(text, voice=voice, sampling=sampling, request_id=rid,
                                        outputs=frozenset({audio_port}))
        except ValueError as exc:
            self.response_id = None
            self.send("error", error={"type": "invalid_request_error", "message": str(exc)})
            return
        user = None if item is not None else ("user", text or "") if audio is None else ("user", text or "", audio)
        await self._stream_response(rid, text, text_port, audio_port, received, self.conductor.submit(request), user,
                                    item_turn=item)

    async def _stream_response(self, rid: str, text: str | None, text_port, audio_port, received: float,
                               outputs, user: tuple | None = None, item_turn: tuple | None = None) -> None:
        """The response's outputs to the peer as they come: audio to its track, events on its channel.
        ``user``: the turn answered, which joins the conversation with the answer (None: it is in it already)."""
        model = self.model
        self.responses += 1
        timing = ResponseTiming(rid, received)
        self.timings.append(timing)
        underruns_before = self.track.underruns
        self.send("response.created", response={"id": rid, "status": "in_progress"})
        if text_port is None:  # a text-to-speech model says the text itself
            self.send("response.output_audio_transcript.delta", response_id=rid, delta=text)
        reply_ids: list[int] = []
        said = ""
        self.track.begin()
        status = "completed"
        try:
            async for out in outputs:
                if out.name == audio_port:
                    timing.last_chunk = time.monotonic()
                    timing.first_chunk = timing.first_chunk or timing.last_chunk
                    timing.audio_s += out.data.numel() / model.sample_rate
                    self.track.push(out.data, model.sample_rate)
                elif out.name == text_port:
                    reply_ids.append(int(out.data))
                    now = model.decode_text(reply_ids)
                    if now.startswith(said) and not now.endswith("\ufffd"):  # whole characters only
                        if len(now) > len(said):
                            self.send("response.output_audio_transcript.delta", response_id=rid, delta=now[len(said):])
                        said = now
            self.track.end()
            if text_port is not None:
                said = model.decode_text(reply_ids)
                self.send("response.output_audio_transcript.done", response_id=rid, transcript=said)
                self._remember(user, said, answered=item_turn)
            while self.track.queued_ms > 0 and not self.closed:  # done when the peer has heard it
                await asyncio.sleep(0.02)
            self.send("response.output_audio.done", response_id=rid)
        except (RequestCancelled, asyncio.CancelledError):
            status = "cancelled"
        except RequestError as exc:
            status = "failed"
            self.send("error", error={"type": "server_error", "message": str(exc)})
        finally:
            timing.first_frame, timing.status = self.track.first_audio_at, status
            timing.underruns = self.track.underruns - underruns_before
            if self.response_id == rid:
                self.response_id = None
            self.send("response.done", response={"id": rid, "status": status})

    async def _listen(self, track) -> None:
        """The peer's microphone through the VAD: speech events, and barge-in when it speaks over a response."""
        from aiortc.mediastreams import MediaStreamError

        from mstar_ros.webrtc.audio_in import SpeechDetector

        detector = SpeechDetector(self.silence_duration_ms)
        try:
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
                        async with self._switch:
                            if self.response_id is not None or self.track.queued_ms > 0:
                                await self.cancel_response()  # barge-in: the user speaks over the response
                            if self.streams_turns:
                                self._begin_turn()
                    else:
                        self.send("input_audio_buffer.speech_stopped", audio_end_ms=event.ms)
                        if self.turn is not None:
                            self._end_turn(event.tail)
                        elif self.listens and not self.streams_turns and event.audio is not None and len(event.audio):
                            await self._answer_turn(event.audio)
                if self.turn is not None:
                    self._push(self.turn, detector.fresh_turn_audio())
        finally:
            if self.turn is not None and not self.closed:  # the microphone stopped mid-turn: what came is answered
                self._end_turn([])

    def _begin_turn(self) -> None:
        """The user starts speaking: the turn's request starts now, its audio streaming in as it comes."""
        rid = f"resp_{uuid.uuid4().hex[:12]}"
        try:
            request, stream = self.model.listen_request(history=list(self.history), voice=self.voice,
                                                        sampling=self.sampling, request_id=rid,
                                                        outputs=frozenset({self.model.audio_output, self.model.text_output}))
        except ValueError as exc:
            self.send("error", error={"type": "invalid_request_error", "message": str(exc)})
            return
        self.turn = StreamedTurn(request, stream, asyncio.get_running_loop().create_future())
        self._task = asyncio.ensure_future(self._respond(None, self.voice, self.sampling, time.monotonic(),
                                                         turn=self.turn))

    def _push(self, turn: StreamedTurn, samples) -> None:
        if not len(samples) or turn.stream.closed:
            return
        try:
            turn.stream.push(samples)
            turn.pieces.append(samples)
        except ValueError:  # over the model's limit: the stream failed, the request with it; its response says so
            turn.failed = True  # the rest of the turn is dropped, its stop ends nothing
            if not turn.ended.done():
                turn.ended.set_result(time.monotonic())

    def _committed(self, samples: int) -> None:
        """The user's turn is the model's input now (its length at the model's input rate)."""
        self.send("input_audio_buffer.committed", item_id=f"item_{uuid.uuid4().hex[:12]}",
                  audio_ms=samples * 1000 // self.model.audio_input_rate)

    def _end_turn(self, tail) -> None:
        """The turn ends: its last samples go in and its stream closes; the answer starts."""
        turn, self.turn = self.turn, None
        turn.streamed_before_end = turn.stream.samples
        self.last_turn = turn
        self._push(turn, tail)
        if turn.stream.closed:
            return
        turn.stream.close()
        self._committed(turn.stream.samples)
        if not turn.ended.done():
            turn.ended.set_result(time.monotonic())

    MAX_HISTORY_TURNS = 20
    MAX_HISTORY_AUDIO_S = 120.0  # spoken turns the model hears again with each new one
    MAX_HISTORY_IMAGES = 8       # and images it sees again,
    MAX_HISTORY_IMAGE_PIXELS = 2048 * 2048  # of this many pixels together (an item's own are refused past it)

    def _remember(self, user: tuple | None, said: str, answered: tuple | None = None) -> None:
        """A turn and its answer join the conversation: a typed one as text, a spoken one with its audio
        (the model hears it again next turn, as the reference takes a conversation's audio); an item
        ``answered`` is in it already, and its answer goes right after it (items added meanwhile follow)."""
        if not said.strip() or (user is not None and len(user) == 2 and not user[1].strip()):
            return
        history = list(self.history)
        at = next((i for i, turn in enumerate(history) if turn is answered), None) if answered is not None else None
        if at is not None:
            history.insert(at + 1, ("assistant", said))
        else:
            history += ([] if user is None else [user]) + [("assistant", said)]
        self.history = self._trimmed(history)

    def _trimmed(self, history: list) -> list:
        """The oldest turns go first past MAX_HISTORY_TURNS, MAX_HISTORY_AUDIO_S of kept audio, or
        MAX_HISTORY_IMAGES or MAX_HISTORY_IMAGE_PIXELS of kept images; system turns stay, and the
        rest then starts at a user turn. The newest turn always stays."""
        rate = self.model.audio_input_rate or 16_000

        def over(turns) -> bool:
            audio_s = sum(len(t[2]) for t in turns if len(t) > 2 and t[2] is not None) / rate
            images = [image for t in turns for image in turn_images(t)]
            return len(turns) > self.MAX_HISTORY_TURNS or audio_s > self.MAX_HISTORY_AUDIO_S or \
                len(images) > self.MAX_HISTORY_IMAGES or sum(map(image_pixels, images)) > self.MAX_HISTORY_IMAGE_PIXELS

        if not over(history):
            return history
        system = [t for t in history if t[0] == "system"]
        rest = [t for t in history if t[0] != "system"]
        while len(rest) > 1 and over(system + rest):
            rest = rest[1:]
            while len(rest) > 1 and rest[0][0] == "assistant":
                rest = rest[1:]
        return system + rest

    async def _answer_turn(self, samples) -> None:
        """The end of the user's spoken turn: its audio goes to the model, which answers it."""
        import torch

        self._committed(len(samples))
        async with self._switch:
            await self.cancel_response()
            self._task = asyncio.ensure_future(self._respond(None, self.voice, self.sampling, time.monotonic(),
                                                             audio=torch.from_numpy(samples)))

    async def cancel_response(self) -> None:
        """Barge-in: the request is cancelled in the runtime (its KV freed) and queued audio dropped."""
        rid, task = self.response_id, self._task
        self.turn = None  # a turn streaming in goes with its request
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
