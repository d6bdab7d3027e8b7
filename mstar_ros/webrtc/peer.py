"""One browser (or any WebRTC peer) of the gateway: its connection, its audio track, its responses.

Each peer has its own session in the runtime; every peer's requests batch in one Conductor. On
``response.create`` the text becomes the speech model's request; the graph's audio chunks go to
the peer's track as they are decoded (mstar_ros.webrtc.audio_out), and the events go out on the
data channel, as OpenAI's WebRTC transport sends them (mstar_ros.webrtc.realtime_items).
``response.cancel`` (or the peer leaving) cancels the request in the runtime: its KV blocks are freed
and the queued audio is dropped, so the next turn starts clean. The peer's microphone goes through a
VAD (mstar_ros.webrtc.audio_in): ``input_audio_buffer.speech_started`` / ``speech_stopped``, and speech
over a response interrupts it (barge-in). For a model that answers speech, a turn's audio goes to the
graph: streamed into its request while the turn is said when the model has ``listen_request`` (the
graph's streamed input), else as one clip when the turn ends; a client without a microphone track
sends it as ``input_audio_buffer.append`` events (mstar_ros.webrtc.input_audio). The conversation and
its items: mstar_ros.webrtc.peer_conversation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import msgspec

from mstar.request import RequestCancelled, RequestError, UnknownRequest
from mstar_ros.webrtc.audio_out import PacedAudioTrack
from mstar_ros.webrtc.budget import BudgetBusy, SharedBudget
from mstar_ros.webrtc.conversation_items import message_content, turn_images
from mstar_ros.webrtc.events import EventError, error_body, parse_client_event, response_text, server_event
from mstar_ros.webrtc.input_audio import AppendedAudio
from mstar_ros.webrtc.media_parts import MAX_REQUEST_IMAGE_PIXELS, pixels
from mstar_ros.webrtc.peer_conversation import PeerConversation
from mstar_ros.webrtc.peer_loss import LossReport
from mstar_ros.webrtc.peer_microphone import PeerMicrophone, as_tensor
from mstar_ros.webrtc.realtime_items import ItemIds, ResponseEvents, usage
from mstar_ros.webrtc.response_timing import ResponseTiming, StreamedTurn
from mstar_ros.webrtc.session_update import PCM_24K, UNSET, SessionChange, session_change
from mstar_ros.webrtc.speech_models import checked_voice, model_voices

log = logging.getLogger("mstar_ros.webrtc")
MAX_TEXT_CHARS = 2000


class VoicePeer(PeerConversation, PeerMicrophone):
    def __init__(
        self,
        pc,
        model,
        conductor,
        *,
        max_text_chars: int = MAX_TEXT_CHARS,
        silence_duration_ms: int = 500,
        decode_budget: SharedBudget | None = None,
        model_name: str | None = None,
    ) -> None:
        self.pc, self.model, self.conductor = pc, model, conductor
        self.model_name = model_name or type(model).__name__  # what session.created calls the served model
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
        self.last_activity = time.monotonic()  # an event from the peer, or the end of an answer's audio
        self.silence_duration_ms = silence_duration_ms
        self.vad_threshold = 0.5
        self.turn_detection = True  # off only for a peer without a microphone track (session.update)
        self.speech_events = 0
        self.voice: str | None = None  # None: the model's own default
        self.instructions: str | None = None  # session.instructions: a system turn before the conversation
        # a conversational model's earlier turns: (role, text), and a spoken one's audio (role, text, samples)
        self.history: list[tuple] = []
        self.items = ItemIds()  # the conversation's items, by the ids clients name them with
        self.appended = AppendedAudio()  # input_audio_buffer.append's audio, until commit
        self.playing: str | None = None  # the response whose audio the track is playing
        self._cancel_reason = "client_cancelled"
        self.has_microphone = False
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
        self.loss = LossReport(self.id)
        pc.addTrack(self.track)

        @pc.on("iceconnectionstatechange")
        def on_ice_state() -> None:
            self.loss.ice_state(pc, responding=self.response_id)

        @pc.on("track")
        def on_track(track) -> None:
            if track.kind == "audio":  # the microphone
                self.has_microphone = True
                self._listener = asyncio.ensure_future(self._listen(track))

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            self.channel = channel
            self.send(
                "session.created",
                session={**self.session_state(), "output_audio_format": {"type": "audio/opus", "rate": 48000}},
            )

            @channel.on("message")
            def on_message(message) -> None:
                self.last_activity = time.monotonic()
                asyncio.ensure_future(self.on_event(message))

            @channel.on("close")
            def on_close() -> None:  # the page went away: its response and KV go now
                asyncio.ensure_future(self.close())

    def send(self, kind: str, **fields) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        # a closed tab ends DTLS before its channel reads closed: an event sent then would fail in aiortc's
        # flush task, an asyncio traceback in the log, so nothing is sent once the transport is down
        sctp = getattr(channel, "transport", None)  # None: a stand-in without SCTP (a WHIP session's events)
        if sctp is not None and (sctp.state != "connected" or sctp.transport.state != "connected"):
            return
        channel.send(server_event(kind, **fields))

    def error(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        self.send("error", error=error_body(message, param=param, code=code, event_id=event_id, kind=kind))

    def outputs_wanted(self) -> frozenset:
        """The graph outputs a response streams: its audio, the reply's text, and the audio tokens usage counts."""
        text = getattr(self.model, "text_output", None) if self.conversational else None
        return frozenset({self.model.audio_output, text, getattr(self.model, "audio_token_output", None)} - {None})

    @property
    def default_voice(self) -> str | None:
        return self.voice or getattr(self.model, "voice", None)

    async def on_event(self, message) -> None:
        async with self._in_order:  # an item decoding its image is in the conversation before a later response.create
            if not self.closed:  # events queued behind a slow one are dropped once the peer has gone
                await self._on_event(message)

    async def _on_event(self, message) -> None:
        event_id = None
        try:
            event = parse_client_event(message)
            event_id = event.event_id
            handler = {
                "response.create": self._create_response,
                "response.cancel": self._cancel,
                "conversation.item.create": self._create_item,
                "conversation.item.delete": self._delete_item,
                "conversation.item.truncate": self._truncate_item,
                "input_audio_buffer.append": self._append_audio,
                "input_audio_buffer.clear": self._clear_audio,
                "input_audio_buffer.commit": self._commit_audio,
                "output_audio_buffer.clear": self._cancel,
                "session.update": self._update_session,
            }.get(event.type)
            if handler is None:
                raise EventError(f"unknown event type {event.type!r}", param="type", code="unknown_event")
            await handler(event)
        except EventError as exc:
            self.error(str(exc), param=exc.param, code=exc.code, event_id=event_id)
        except (ValueError, BudgetBusy) as exc:
            self.error(str(exc), event_id=event_id)

    async def _create_response(self, event) -> None:
        text = response_text(event, required=not self.conversational)
        if text is not None and len(text) > self.max_text_chars:
            raise EventError(
                f"text of {len(text)} characters is over the {self.max_text_chars} limit", param="response.instructions"
            )
        spec = event.response
        sampling = self.sampling
        if spec is not None and spec.max_output_tokens is not None:
            sampling = self._sampling_with(max_tokens=spec.max_output_tokens)
        received = time.monotonic()
        voice = self.voice
        if spec is not None and spec.voice is not None:
            voice = checked_voice(self.model, spec.voice, "response.voice")
        answers_item = self.conversational and text is None
        if answers_item:
            self._split_last_item()  # refused here, before the response playing now is cancelled
        async with self._switch:
            await self.cancel_response()  # one response at a time: a new one replaces it
            # the conversation as it is now: a response that ended during the cancel is in it
            history, item = self._split_last_item() if answers_item else (list(self.history), None)
            self._task = asyncio.ensure_future(
                self._respond(text, voice, sampling, received, history=history, item=item)
            )

    async def _cancel(self, _event) -> None:
        await self.cancel_response()

    def _conversation_only(self, what: str) -> None:
        if not self.conversational:
            raise EventError(f"{what}: this model keeps no conversation: it speaks the text of response.create")

    async def _create_item(self, event) -> None:
        self._conversation_only("conversation.item.create")
        # decoding, preparing and checking it against the conversation is CPU work: off the loop;
        # its images are judged from their headers first, and decoded once their pixels are reserved
        added = await asyncio.to_thread(self._opened_item, event.item, list(self.history))
        async with self.decode_budget.reserve(pixels(added.images)):
            turn = await asyncio.to_thread(self._checked_item, added, list(self.history))
        if not self.closed:
            self._add_item(added, turn)

    async def _delete_item(self, event) -> None:
        self.delete_item(event.item_id)

    async def _truncate_item(self, event) -> None:
        item = self.truncated_item(event.item_id, event.content_index, event.audio_end_ms)
        if item.response_id is not None and item.response_id == self.playing:
            await self.cancel_response()  # the listener stopped there: the rest is not played either

    async def _append_audio(self, event) -> None:
        if not self.listens:
            raise EventError(
                "input_audio_buffer.append: this model takes no audio input (it speaks the text of response.create)",
                param="audio",
            )
        self.appended.append(event.audio)

    async def _clear_audio(self, _event) -> None:
        self.appended.clear()
        self.send("input_audio_buffer.cleared")

    async def _commit_audio(self, _event) -> None:
        self.commit_appended()

    def _sampling_with(self, **changes):
        """The session's sampling with ``changes``; a bad value is an error naming the field."""
        limit = self.model.default_sampling.max_tokens
        tokens = changes.get("max_tokens")
        if tokens is not None and not 1 <= tokens <= limit:
            raise EventError(f"max_output_tokens = {tokens} must be in [1, {limit}]", param="max_output_tokens")
        return msgspec.structs.replace(self.sampling, **changes)  # SamplingParams checks the rest

    async def _update_session(self, event) -> None:
        change = session_change(
            event.session,
            model_name=self.model_name,
            takes_instructions=self.conversational,
            has_microphone=self.has_microphone,
            check_voice=lambda voice, field: checked_voice(self.model, voice, field),
            max_tokens_limit=self.model.default_sampling.max_tokens,
        )
        self.apply_session(change)

    def apply_session(self, change: SessionChange) -> None:
        """All of the change, or (a bad value: an error naming it) none of it."""
        sampling = self._sampling_with(**change.sampling)
        instructions = self.instructions if change.instructions is UNSET else change.instructions
        if instructions and instructions != self.instructions:  # refused unless the model takes it as a system turn
            try:
                self.model.request("and?", history=[("system", instructions)], sampling=sampling)
            except ValueError as exc:
                raise EventError(f"session.instructions: {exc}", param="session.instructions") from None
        self.sampling, self.instructions = sampling, instructions
        self.voice = change.voice or self.voice
        if change.silence_duration_ms is not None:
            self.silence_duration_ms = change.silence_duration_ms  # from the next microphone track on
        if change.vad_threshold is not None:
            self.vad_threshold = change.vad_threshold
        self.turn_detection = not change.turn_detection_off and self.turn_detection
        self.send("session.updated", session=self.session_state())

    def session_state(self) -> dict:
        s = self.sampling
        detection = (
            {
                "type": "server_vad",
                "silence_duration_ms": self.silence_duration_ms,
                "threshold": self.vad_threshold,
                "prefix_padding_ms": 300,
                "create_response": True,
                "interrupt_response": True,
            }
            if self.turn_detection
            else None
        )
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.session,
            "model": self.model_name,
            "random_weights": bool(getattr(self.model, "random_weights", False)),
            "output_modalities": ["audio"],
            "instructions": self.instructions,
            "audio": {
                "input": {"format": PCM_24K, "turn_detection": detection},
                "output": {"voice": self.default_voice},
            },
            "voice": self.default_voice,
            "voices": list(model_voices(self.model)),
            "max_output_tokens": s.max_tokens,
            "input_image": self.takes_images,  # conversation.item.create takes input_image parts
            "temperature": s.temperature,
            "top_p": s.top_p,
            "repetition_penalty": s.repetition_penalty,
            "seed": s.seed,
            "turn_detection": detection,
        }

    async def _respond(
        self,
        text: str | None,
        voice: str | None,
        sampling,
        received: float,
        audio=None,
        turn: StreamedTurn | None = None,
        history: list | None = None,
        item: tuple | None = None,
        user_id: str | None = None,
    ) -> None:
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
            await self._stream_response(
                rid,
                text,
                text_port,
                audio_port,
                received,
                outputs,
                turn.request,
                voice,
                ("user", "") if heard is None else ("user", "", heard),
                user_id=turn.item_id,
            )
            return
        try:
            if self.conversational:  # a turn of the conversation: the model answers it
                history = list(self.history) if history is None else history
                images = []
                if item is not None:
                    text, images = item[1], turn_images(item)
                    audio = as_tensor(item[2]) if len(item) > 2 and item[2] is not None else None
                request = model.request(
                    text,
                    audio=audio,
                    images=images,
                    history=self._model_history(history),
                    voice=voice,
                    sampling=sampling,
                    request_id=rid,
                    outputs=self.outputs_wanted(),
                )
            else:  # a text-to-speech model speaks the text itself
                request = model.request(
                    text, voice=voice, sampling=sampling, request_id=rid, outputs=self.outputs_wanted()
                )
        except ValueError as exc:
            self.response_id = None
            self.error(str(exc))
            return
        user = None if item is not None else ("user", text or "") if audio is None else ("user", text or "", audio)
        if self.conversational and user is not None and audio is None:  # a typed turn is an item too
            user_id = self.file_user_turn(None, message_content("user", text or ""))
        await self._stream_response(
            rid,
            text,
            text_port,
            audio_port,
            received,
            self.conductor.submit(request),
            request,
            voice,
            user,
            item_turn=item,
            user_id=user_id,
        )

    async def _stream_response(
        self,
        rid: str,
        text: str | None,
        text_port,
        audio_port,
        received: float,
        outputs,
        request,
        voice: str | None,
        user: tuple | None = None,
        item_turn: tuple | None = None,
        user_id: str | None = None,
    ) -> None:
        """The response's outputs to the peer as they come: audio to its track, events on its channel.
        ``user``: the turn answered, which joins the conversation with the answer (None: it is in it already)."""
        model = self.model
        self.responses += 1
        timing = ResponseTiming(rid, received)
        self.timings.append(timing)
        underruns_before = self.track.underruns
        events = ResponseEvents(self.send, rid, voice or getattr(model, "voice", None))
        events.begin(self.items.add(events.item_id, None, "assistant", response_id=rid))
        if text_port is None:  # a text-to-speech model says the text itself
            events.delta(text)
        reply_ids: list[int] = []
        audio_tokens, token_port = 0, getattr(model, "audio_token_output", None)
        self.track.begin()
        status, error = "completed", None
        try:
            async for out in outputs:
                if out.name == audio_port:
                    timing.last_chunk = time.monotonic()
                    timing.first_chunk = timing.first_chunk or timing.last_chunk
                    timing.audio_s += out.data.numel() / model.sample_rate
                    self.track.push(out.data, model.sample_rate)
                    self.playing = rid
                    events.audio()
                elif out.name == token_port:
                    audio_tokens += 1  # one item a token (Orpheus) or a Talker frame (Qwen3-Omni)
                elif out.name == text_port:
                    reply_ids.append(int(out.data))
                    now = model.decode_text(reply_ids)
                    if now.startswith(events.transcript) and not now.endswith("\ufffd"):  # whole characters only
                        events.delta(now[len(events.transcript) :])
            self.track.end()
            if text_port is not None:
                said = model.decode_text(reply_ids)
                events.delta(said[len(events.transcript) :] if said.startswith(events.transcript) else "")
                events.transcript = said
                self._remember(user, said, answered=item_turn, user_id=user_id, answer_id=events.item_id)
        except (RequestCancelled, asyncio.CancelledError):
            status = "cancelled"
        except RequestError as exc:
            status, error = "failed", error_body(str(exc), code="model_error", kind="server_error")
            self.error(str(exc), code="model_error", kind="server_error")
        finally:
            timing.first_frame, timing.status = self.track.first_audio_at, status
            timing.underruns = self.track.underruns - underruns_before
            if self.response_id == rid:
                self.response_id = None
            self.items.update(events.item_id, audio_ms=int(timing.audio_s * 1000))
            events.finish(
                status,
                usage(model, request, len(reply_ids), audio_tokens),
                reason=self._cancel_reason if status == "cancelled" else None,
                error=error,
            )
        if status == "completed":
            await self._play_out(rid, timing)

    async def _play_out(self, rid: str, timing: ResponseTiming) -> None:
        """The response's audio plays to its end: output_audio_buffer.stopped (a cancel in the meantime clears it)."""
        while self.track.queued_ms > 0 and not self.closed:
            await asyncio.sleep(0.02)
        timing.first_frame = timing.first_frame or self.track.first_audio_at
        if self.playing == rid:
            self.playing = None
            self.last_activity = time.monotonic()  # idleness counts from the end of the answer
            self.send("output_audio_buffer.stopped", response_id=rid)

    async def cancel_response(self, reason: str = "client_cancelled") -> None:
        """Barge-in: the request is cancelled in the runtime (its KV freed) and queued audio dropped."""
        rid, task = self.response_id, self._task
        self._cancel_reason = reason  # the cancelled response's status_details say why
        self.turn = None  # a turn streaming in goes with its request
        self._clear_playing()
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
        self._clear_playing()

    def _clear_playing(self) -> None:
        """Drop the audio queued for the peer; a response's audio that stops short says output_audio_buffer.cleared."""
        self.track.clear()
        if self.playing is not None:
            self.send("output_audio_buffer.cleared", response_id=self.playing)
            self.playing = None

    @property
    def idle_s(self) -> float:
        """Seconds since the peer's last event or the end of what played to it (0 while busy)."""
        # `playing` stays set until output_audio_buffer.stopped: between the queue running dry and that
        # event the peer is still being answered, not idle since its response.create
        if self.response_id is not None or self.playing is not None or self.track.queued_ms > 0:
            return 0.0
        return time.monotonic() - self.last_activity

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
