"""Qwen3-Omni as a conversational speech model: what the voice gateway and the OpenAI-compatible HTTP serve.

A speech model that *answers* (``conversational``): a turn is the user's text or a clip of their
voice (16 kHz samples, ``audio_input_rate``), with images if they like, and the conversation so far (text turns, and spoken
ones with their audio, which the Thinker hears again as the reference does), or a turn
whose voice streams in while it is said (:meth:`listen_request`: the request starts with the turn,
its frames are computed as the samples come, and the answer starts when the stream closes); the reply's
text streams out on ``text_output`` (token ids, :meth:`decode_text` makes text of them) and its
voice on ``audio_output`` at ``sample_rate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mstar.conductor import Request
from mstar.conductor.stream_input import SampleStream
from mstar.sampling_params import SamplingParams
from mstar_graphs.qwen3_omni.audio_encoder import tokens_for_frames
from mstar_graphs.qwen3_omni.audio_features import SAMPLE_RATE as INPUT_RATE
from mstar_graphs.qwen3_omni.audio_features import log_mel
from mstar_graphs.qwen3_omni.audio_stream import turn_stream
from mstar_graphs.qwen3_omni.chat import Turn, decode, load_tokenizer, prompt_ids
from mstar_graphs.qwen3_omni.image_processor import ImagePreprocessor, image_pad_count
from mstar_graphs.qwen3_omni.model import TALKER_SAMPLING, Qwen3Omni


@dataclass(frozen=True)
class PreparedImage:
    """An image already through the checkpoint's preprocessor (:meth:`Qwen3OmniChat.prepare_image`): a
    conversation that shows it again each turn does not resize and patch it again, nor keep its pixels."""

    pixel_values: torch.Tensor
    grid: tuple[int, int, int]
    pixels: int  # of the resized image the patches cover


# (role, text[, its audio[, its images]]): an image is what ImagePreprocessor takes (PIL, uint8 array), or a
# PreparedImage
HistoryTurn = (
    tuple[str, str] | tuple[str, str, "torch.Tensor | None"] | tuple[str, str, "torch.Tensor | None", Sequence]
)
FIRST_CHUNK = 5  # a voice chat starts speaking after 5 frames (0.4 s of audio), not 25 (2 s)


class Qwen3OmniChat:
    conversational = True
    audio_output = "audio"
    text_output = "text_ids"
    sample_rate = 24_000
    audio_input_rate = INPUT_RATE
    image_input = True  # a turn may show images (request(images=...)), as /v1/chat/completions' image_url parts
    default_sampling = TALKER_SAMPLING  # what session.update changes: the voice's sampling
    max_reply_tokens = 256
    audio_token_output = "codes"  # one item per Talker frame: the output audio tokens usage counts
    speech_instructions = True  # speech_request takes instructions (/v1/audio/speech's)

    def __init__(self, model: Qwen3Omni) -> None:
        self.model = model
        self.tokenizer = load_tokenizer(model.path)
        self.images = ImagePreprocessor.from_dir(model.path)  # the checkpoint's preprocessor_config.json

    @classmethod
    def load(
        cls,
        weights: str | Path | None = None,
        *,
        progress: bool = True,
        preset: str = "tiny",
        first_chunk: int | None = FIRST_CHUNK,
        requests_only: bool = False,
    ) -> Qwen3OmniChat:
        return cls(
            Qwen3Omni.load(
                weights, progress=progress, preset=preset, first_chunk=first_chunk, requests_only=requests_only
            )
        )

    @property
    def random_weights(self) -> bool:
        return self.model.random_weights

    @property
    def voices(self) -> tuple[str, ...]:
        """The checkpoint's speakers (its Talker config's ``speaker_id``), by name."""
        return tuple((self.model.config.talker_config.speaker_id or {}).keys())

    @property
    def voice(self) -> str:
        """The speaker used when a request names none."""
        return self.model.speaker

    def graph(self):
        return self.model.graph()

    def worker_spec(self):
        """What Worker processes build to serve this model (``Conductor.distributed``)."""
        from mstar_graphs.qwen3_omni.components import qwen3_omni_spec

        return qwen3_omni_spec(self.model.path, first_chunk=self.model.first_chunk)

    def modules(self):
        return self.model.modules()

    @property
    def special_token_ids(self) -> dict[str, int]:
        """The prompt's placeholders for a clip's and an image's tokens (what usage counts as audio and image
        tokens of a prompt), and the token that ends a reply (a reply cut short lacks it)."""
        thinker = self.model.config.thinker_config
        return {
            "audio": thinker.audio_token_id,
            "image": thinker.image_token_id,
            "end": self.model.config.im_end_token_id,
        }

    def decode_text(self, ids: list[int]) -> str:
        return decode(self.tokenizer, ids)

    def speech_request(
        self,
        text: str,
        *,
        voice: str | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        outputs: frozenset[str] | None = None,
        instructions: str | None = None,
    ) -> Request:
        """Text to speech (``/v1/audio/speech``): the Talker speaks ``text`` as if it were the reply to a
        user turn asking for it; the Thinker does not run. ``instructions`` (how to say it) go in that user
        turn: the Talker reads the prompt's user turns only, so a system turn would not reach it."""
        if not text or not text.strip():
            raise ValueError("input is empty")
        ask = f"{instructions.strip()}\nSay this." if instructions and instructions.strip() else "Say this."
        ids = prompt_ids(self.tokenizer, self.model.config, [Turn("user", ask)])
        talker = sampling or TALKER_SAMPLING
        return self.model.request(
            ids,
            say_ids=self.tokenizer.encode(text, add_special_tokens=False).ids,
            speaker=voice,
            talker_max_tokens=talker.max_tokens,
            talker_sampling=talker,
            seed=talker.seed,
            request_id=request_id,
            outputs=outputs,
        )

    def request(
        self,
        text: str | None = None,
        *,
        audio: torch.Tensor | None = None,
        images: Sequence = (),
        history: Sequence[HistoryTurn] = (),
        voice: str | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        outputs: frozenset[str] | None = None,
        speak: bool = True,
    ) -> Request:
        """One user turn (``text``, or ``audio``: 16 kHz mono float samples, or both) after ``history``
        ((role, text) turns, or (role, text, audio) for a spoken one, (role, text, audio, images) with
        images) -> the request. ``images``: the turn's images (PIL images or uint8 arrays [H, W, 3]),
        shown before its text. ``sampling`` samples the voice; its max_tokens caps the reply's text
        tokens (at most ``max_reply_tokens``) and its audio frames."""
        features = None if audio is None else log_mel(audio.reshape(-1).float())
        if features is None and not images and not (text and text.strip()):
            raise ValueError("an empty turn: give text, audio or an image")
        return self._turn(text, features, None, history, voice, sampling, request_id, outputs, speak, images)

    def listen_request(
        self,
        *,
        history: Sequence[HistoryTurn] = (),
        images: Sequence = (),
        voice: str | None = None,
        sampling: SamplingParams | None = None,
        request_id: str | None = None,
        outputs: frozenset[str] | None = None,
        speak: bool = True,
    ) -> tuple[Request, SampleStream]:
        """A spoken turn that streams in: the request (submit it as the turn starts) and the stream its
        16 kHz samples go into (``push`` as they come, ``close`` at the end of the turn). ``images``: the
        turn's own, shown before it (encoded while it is said, as are the history's)."""
        stream = turn_stream()
        return self._turn(None, None, stream, history, voice, sampling, request_id, outputs, speak, images), stream

    def _tokens(self, features: torch.Tensor) -> int:
        return tokens_for_frames(features.shape[1], self.model.config.thinker_config.audio_config.n_window)

    def prepare_image(self, image) -> PreparedImage:
        """An image resized and patched once, for a conversation to show again on every turn."""
        values, grid = self.images(image)
        t, h, w = (int(g) for g in grid)
        return PreparedImage(values, (t, h, w), h * w * self.images.patch_size**2)

    def _pictures(self, images: Sequence) -> tuple[list, tuple[int, ...]]:
        """Images -> (pixel_values, grid) each, and each one's image pad count."""
        made = [
            (image.pixel_values, image.grid) if isinstance(image, PreparedImage) else self.images(image)
            for image in images
        ]
        return made, tuple(image_pad_count(grid, self.images.merge_size) for _, grid in made)

    def check_images(self, images: Sequence) -> None:
        """The images' pads from their sizes alone (PIL images whose pixels are not decoded yet will do), against
        the context: a front-end refuses images too large for it before it decodes any."""
        grids = [
            image.grid
            if isinstance(image, PreparedImage)
            else self.images.grid_thw(
                *((image.height, image.width) if hasattr(image, "height") else tuple(image.shape[:2]))
            )
            for image in images
        ]
        pads = sum(image_pad_count(grid, self.images.merge_size) for grid in grids)
        room = self.model.config.thinker_config.text_config.max_position_embeddings - 64  # the turn's text, a reply
        if pads > room:
            raise ValueError(f"the images make {pads} image tokens, over the {room} the context has room for")

    def _turn(self, text, features, pcm, history, voice, sampling, request_id, outputs, speak, images=()) -> Request:
        clips, pictures, turns = [], [], []
        shown_before = [images for role, _, *heard in history for images in heard[1:2] if images]
        if any(len(heard) > 1 and heard[1] and role != "user" for role, _, *heard in history):
            raise ValueError("images are taken in user turns only")
        self.check_images([image for group in shown_before for image in group] + list(images))
        for role, said, *heard in history:  # a spoken turn's audio goes in again, as the reference takes it
            audio = heard[0] if heard else None
            clip = None if audio is None else log_mel(torch.as_tensor(audio).reshape(-1).float())
            clips += [] if clip is None else [clip]
            shown, pads = self._pictures(heard[1] if len(heard) > 1 else ())
            pictures += shown
            turns.append(Turn(role, said, 0 if clip is None else self._tokens(clip), pads))
        clips += [] if features is None else [features]
        last = 1 if pcm is not None else 0 if features is None else self._tokens(features)
        shown, pads = self._pictures(images)
        pictures += shown
        ids = prompt_ids(self.tokenizer, self.model.config, turns + [Turn("user", text or "", last, pads)])
        talker = sampling or TALKER_SAMPLING
        # max_tokens caps both the reply's text tokens and its audio frames (the Realtime API's max_output_tokens)
        return self.model.request(
            ids,
            features=clips or None,
            pcm=pcm,
            images=pictures or None,
            audio=speak,
            speaker=voice,
            thinker_max_tokens=min(self.max_reply_tokens, talker.max_tokens),
            talker_max_tokens=talker.max_tokens,
            talker_sampling=talker,
            seed=talker.seed,
            request_id=request_id,
            outputs=outputs,
        )
