"""A peer's microphone: its audio track through the VAD, the spoken turns it cuts, and barge-in.

``input_audio_buffer.speech_started`` / ``speech_stopped`` as the VAD hears them (mstar_ros.webrtc.audio_in);
speech over a response cancels it. For a model that answers speech, a turn's audio goes to the graph:
streamed into its request while the turn is said when the model has ``listen_request`` (the graph's
streamed input), else as one clip when the turn ends; ``input_audio_buffer.committed`` and the turn's
``conversation.item.created`` come when it ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from mstar_ros.webrtc.conversation_items import message_content
from mstar_ros.webrtc.response_timing import StreamedTurn


def as_tensor(samples):
    """A turn's samples (numpy or torch) as the torch tensor a model's request takes."""
    import torch

    return torch.as_tensor(samples)


class PeerMicrophone:
    """VoicePeer's microphone side (it reads the peer's model, VAD settings, conversation and responses)."""

    async def _listen(self, track) -> None:
        """The peer's microphone through the VAD: speech events, and barge-in when it speaks over a response."""
        from aiortc.mediastreams import MediaStreamError

        from mstar_ros.webrtc.audio_in import SpeechDetector

        detector = SpeechDetector(self.silence_duration_ms, threshold=self.vad_threshold)
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
                                await self.cancel_response("turn_detected")  # barge-in: the user speaks over it
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
            request, stream = self.model.listen_request(
                history=self._model_history(self.history),
                voice=self.voice,
                sampling=self.sampling,
                request_id=rid,
                outputs=self.outputs_wanted(),
            )
        except ValueError as exc:
            self.error(str(exc))
            return
        self.turn = StreamedTurn(request, stream, asyncio.get_running_loop().create_future())
        self._task = asyncio.ensure_future(
            self._respond(None, self.voice, self.sampling, time.monotonic(), turn=self.turn)
        )

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

    def _committed(self, samples: int) -> str:
        """The user's turn is the model's input now (its length at the model's input rate): its item's id, the turn
        joining the conversation with its answer."""
        item_id = f"item_{uuid.uuid4().hex[:12]}"
        self.send(
            "input_audio_buffer.committed",
            previous_item_id=self.items.last,
            item_id=item_id,
            audio_ms=samples * 1000 // self.model.audio_input_rate,
        )
        return self.file_user_turn(None, message_content("user", "", audio=True), item_id)

    def _end_turn(self, tail) -> None:
        """The turn ends: its last samples go in and its stream closes; the answer starts."""
        turn, self.turn = self.turn, None
        turn.streamed_before_end = turn.stream.samples
        self.last_turn = turn
        self._push(turn, tail)
        if turn.stream.closed:
            return
        turn.stream.close()
        turn.item_id = self._committed(turn.stream.samples)
        if not turn.ended.done():
            turn.ended.set_result(time.monotonic())

    async def _answer_turn(self, samples) -> None:
        """The end of the user's spoken turn: its audio goes to the model, which answers it."""
        user_id = self._committed(len(samples))
        async with self._switch:
            await self.cancel_response("turn_detected")
            self._task = asyncio.ensure_future(
                self._respond(
                    None, self.voice, self.sampling, time.monotonic(), audio=as_tensor(samples), user_id=user_id
                )
            )
