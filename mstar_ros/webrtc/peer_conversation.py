"""A peer's conversation (for a model that answers): its turns, their item ids, and what clients do to them.

The model's history is a list of turns, ``(role, text)`` or ``(role, text, audio[, images])``; each turn is
also an item (mstar_ros.webrtc.realtime_items.ItemIds) that ``conversation.item.delete`` removes and
``conversation.item.truncate`` cuts. ``session.instructions`` go before it as a system turn. The
history is bounded (``MAX_HISTORY_*``): the oldest turns go first, system turns stay.
"""

from __future__ import annotations

import uuid

from mstar_ros.webrtc.conversation_items import conversation_item, image_pixels, message_content, turn_images
from mstar_ros.webrtc.events import EventError
from mstar_ros.webrtc.media_parts import load_image
from mstar_ros.webrtc.realtime_items import message_item, new_id


class PeerConversation:
    """VoicePeer's conversation side: reads ``model``, ``history``, ``items``, ``instructions``, ``sampling``,
    ``takes_images``, ``appended``, and sends through ``send``."""

    MAX_HISTORY_TURNS = 20
    MAX_HISTORY_AUDIO_S = 120.0  # spoken turns the model hears again with each new one
    MAX_HISTORY_IMAGES = 8  # and images it sees again,
    MAX_HISTORY_IMAGE_PIXELS = 2048 * 2048  # of this many pixels together (an item's own are refused past it)

    def _model_history(self, history: list) -> list:
        """The turns a request sees: the session's instructions first, as a system turn."""
        return ([("system", self.instructions)] if self.instructions else []) + list(history)

    def _split_last_item(self) -> tuple[list, tuple]:
        """(the turns before it, the conversation's last item): the user's turn a text-less response.create answers."""
        if not self.history or self.history[-1][0] != "user":
            raise EventError(
                "response.create needs text, or a user item to answer "
                "(conversation.item.create or input_audio_buffer.commit) as the conversation's last"
            )
        return list(self.history[:-1]), self.history[-1]

    def _opened_item(self, raw, history: list):
        """The item, checked, its images opened (headers only) and judged against the model's room with the
        conversation's: nothing decoded yet."""
        wanted = raw.get("id") if isinstance(raw, dict) else None
        if wanted is not None and (not isinstance(wanted, str) or not wanted or len(wanted) > 64):
            raise EventError("item.id must be a string of 1 to 64 characters", param="item.id")
        added = conversation_item(
            raw,
            wanted or f"item_{uuid.uuid4().hex[:12]}",
            images_ok=self.takes_images,
            pixels_left=self.MAX_HISTORY_IMAGE_PIXELS,
        )
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
        before = self._model_history(history + ([] if added.role == "user" else [turn]))
        self.model.request(last[1] or None, images=turn_images(last), history=before, sampling=self.sampling)
        return turn

    def _file(self, history: list) -> None:
        """The conversation is ``history``, trimmed; items whose turns went are forgotten."""
        self.history = self._trimmed(history)
        self.items.keep_only(self.history)

    def _add_item(self, added, turn: tuple) -> None:
        if added.id in self.items:
            raise EventError(f"item.id {added.id!r} is in the conversation already", param="item.id")
        self._file(self.history + [turn])
        previous = self.items.add(added.id, turn, added.role)
        self.send("conversation.item.created", previous_item_id=previous, item=added.summary())

    def _remember(
        self,
        user: tuple | None,
        said: str,
        answered: tuple | None = None,
        user_id: str | None = None,
        answer_id: str | None = None,
    ) -> None:
        """A turn and its answer join the conversation: a typed one as text, a spoken one with its audio
        (the model hears it again next turn, as the reference takes a conversation's audio); an item
        ``answered`` is in it already, and its answer goes right after it (items added meanwhile follow)."""
        if not said.strip() or (user is not None and len(user) == 2 and not user[1].strip()):
            return
        answer = ("assistant", said)
        history = list(self.history)
        at = next((i for i, turn in enumerate(history) if turn is answered), None) if answered is not None else None
        if at is not None:
            history.insert(at + 1, answer)
        else:
            history += ([] if user is None else [user]) + [answer]
        self.items.update(user_id, turn=user)
        self.items.update(answer_id, turn=answer)
        self._file(history)

    def _trimmed(self, history: list) -> list:
        """The oldest turns go first past MAX_HISTORY_TURNS, MAX_HISTORY_AUDIO_S of kept audio, or
        MAX_HISTORY_IMAGES or MAX_HISTORY_IMAGE_PIXELS of kept images; system turns stay, and the
        rest then starts at a user turn. The newest turn always stays."""
        rate = self.model.audio_input_rate or 16_000

        def over(turns) -> bool:
            audio_s = sum(len(t[2]) for t in turns if len(t) > 2 and t[2] is not None) / rate
            images = [image for t in turns for image in turn_images(t)]
            return (
                len(turns) > self.MAX_HISTORY_TURNS
                or audio_s > self.MAX_HISTORY_AUDIO_S
                or len(images) > self.MAX_HISTORY_IMAGES
                or sum(map(image_pixels, images)) > self.MAX_HISTORY_IMAGE_PIXELS
            )

        if not over(history):
            return history
        system = [t for t in history if t[0] == "system"]
        rest = [t for t in history if t[0] != "system"]
        while len(rest) > 1 and over(system + rest):
            rest = rest[1:]
            while len(rest) > 1 and rest[0][0] == "assistant":
                rest = rest[1:]
        return system + rest

    def file_user_turn(self, turn: tuple | None, content: list[dict], item_id: str | None = None) -> str:
        """A user turn's item: filed (with its turn once it is in the history) and announced."""
        item_id = item_id or new_id("item")
        previous = self.items.add(item_id, turn, "user")
        self.send("conversation.item.created", previous_item_id=previous, item=message_item(item_id, "user", content))
        return item_id

    def commit_appended(self) -> None:
        """``input_audio_buffer.commit``: the appended audio is the user's turn; ``response.create`` answers it."""
        if not self.listens:
            raise EventError("this model takes no audio input: it speaks the text of response.create")
        samples = self.appended.take(self.model.audio_input_rate)
        turn = ("user", "", samples)
        item_id = new_id("item")
        self.send(
            "input_audio_buffer.committed",
            previous_item_id=self.items.last,
            item_id=item_id,
            audio_ms=len(samples) * 1000 // self.model.audio_input_rate,
        )
        self._file(self.history + [turn])
        self.file_user_turn(turn, message_content("user", "", audio=True), item_id)

    def delete_item(self, item_id) -> None:
        item = self.items.get(item_id)
        if item.turn is not None:
            self.history = [turn for turn in self.history if turn is not item.turn]
        self.items.remove(item_id)
        self.send("conversation.item.deleted", item_id=item_id)

    def truncated_item(self, item_id, content_index, audio_end_ms):
        """``conversation.item.truncate``: an answer cut where its listener stopped hearing it; its text is cut in
        the same proportion (at a word's end), so the model is not told it said what nobody heard. Returns the
        item (its response may still be playing)."""
        item = self.items.get(item_id)
        if item.role != "assistant":
            raise EventError("only an assistant item can be truncated", param="item_id")
        if content_index != 0:
            raise EventError(f"content_index {content_index!r}: an answer has one audio part, 0", param="content_index")
        if (
            not isinstance(audio_end_ms, int)
            or isinstance(audio_end_ms, bool)
            or not 0 <= audio_end_ms <= item.audio_ms
        ):
            raise EventError(
                f"audio_end_ms {audio_end_ms!r} must be in [0, {item.audio_ms}] (the item's audio)",
                param="audio_end_ms",
            )
        if item.turn is not None and item.audio_ms:
            text = item.turn[1]
            keep = text[: len(text) * audio_end_ms // item.audio_ms]
            if len(keep) < len(text) and " " in keep:
                keep = keep[: keep.rindex(" ")]
            cut = ("assistant", keep.strip())
            self.history = [cut if turn is item.turn else turn for turn in self.history]
            self.items.update(item_id, turn=cut)
        item.audio_ms = audio_end_ms
        self.send("conversation.item.truncated", item_id=item_id, content_index=0, audio_end_ms=audio_end_ms)
        return item
