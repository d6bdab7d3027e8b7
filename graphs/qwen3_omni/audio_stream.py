"""A spoken turn streamed in as it is said: the nodes between a microphone's samples and the Thinker.

    input.pcm ~[LeftContext(25, 3, edges)]~> audio_frames --log_mel~[WholeStream]~> audio_encoder --embeds-->
        audio_prompt (input.prompt_ids with one <|audio_pad|> slot) --input_ids, embed_mask--> thinker

``audio_frames`` computes each chunk's log-mel frames while the user speaks (items: 20 ms of 16 kHz
samples, a multiple of the hop; 25 of them a chunk, 3 before it as context). The encoder runs when the
turn ends: its features are floored below the whole clip's maximum, and its attention spans windows
of up to 8 s, so the frames of the whole turn are its input. ``audio_prompt`` then widens the
prompt's one audio slot to as many pads as the encoder made embeddings. The Thinker sees what it
sees for the whole clip given at once (``log_mel`` on it), so the answer is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mstar.conductor.stream_input import SampleStream
from mstar.graph.node import NodeCall, NodeSubmodule
from mstar_graphs.qwen3_omni.audio_features import HOP, MAX_SECONDS, SAMPLE_RATE, check_samples, streamed_log10_mel

ITEM_SAMPLES = 320  # 20 ms at 16 kHz: what a microphone's frame holds, a multiple of the hop
CHUNK_ITEMS = 25  # 0.5 s of audio per audio_frames call
CONTEXT_ITEMS = 3  # 60 ms before it: a frame needs 200 samples left of its centre


def turn_stream() -> SampleStream:
    """The StreamInput a spoken turn's samples go into (any sizes; it cuts them into items)."""
    return SampleStream(ITEM_SAMPLES, max_samples=int(MAX_SECONDS * SAMPLE_RATE))


class AudioFramesNode(NodeSubmodule):
    """Stateless: a chunk of streamed samples (``pcm``, a list of items) -> the log10 mel frames it completes."""

    def __init__(self, mels: int) -> None:
        super().__init__()
        self.mels = mels

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        chunks = []
        for c in calls:
            items = list(c.inputs["pcm"])
            final = bool(c.meta.get("final", 0))
            for i, item in enumerate(items):
                if item.dim() != 1:
                    raise ValueError(f"streamed audio items are 1-D samples, got shape {tuple(item.shape)}")
                # the stream's last item may be shorter; it ends its chunk (a shorter one before it would show
                # in the next chunk's context, and fail there)
                if item.numel() % HOP and i != len(items) - 1:
                    raise ValueError(
                        f"streamed audio items hold a multiple of {HOP} samples (the last may not), got {item.numel()}"
                    )
            samples = torch.cat(items).float()
            check_samples(samples)
            context = sum(item.numel() for item in items[: int(c.meta.get("left_context", 0))])
            chunks.append((samples, context, bool(c.meta.get("first", 0)), final))
        return {"chunks": chunks}

    def batch_key(self, call: NodeCall):
        return "audio_frames"

    def forward(self, chunks: list) -> dict:  # type: ignore[override]
        return {
            "log_mel": [streamed_log10_mel(s, context, first, final, self.mels) for s, context, first, final in chunks]
        }

    def split_outputs(self, outputs, calls):
        return [{"log_mel": m} for m in outputs["log_mel"]]


class AudioPromptNode(NodeSubmodule):
    """Stateless: the prompt with one ``<|audio_pad|>`` slot (at ``meta["slot"]``; earlier spoken turns
    have their pads already) and the embeddings of all its audio -> the prompt with one pad per
    embedding, and the mask of the rows given as embeddings (what the Thinker's prefill takes): the
    audio pads, and the image pads of a prompt with images (their rows: ``media_prompt``)."""

    def __init__(self, audio_token_id: int, max_prompt: int, image_token_id: int | None = None) -> None:
        super().__init__()
        self.audio_token_id, self.max_prompt, self.image_token_id = audio_token_id, max_prompt, image_token_id

    def prepare_inputs(self, calls: Sequence[NodeCall]) -> dict:
        prompts = []
        for c in calls:
            ids, embeds = c.inputs["prompt_ids"].long(), c.inputs["embeds"]
            slot = int(c.meta.get("slot", -1))
            if not 0 <= slot < ids.numel() or int(ids[slot]) != self.audio_token_id:
                raise ValueError(f"meta slot {slot} is not an <|audio_pad|> of the prompt")
            known = int((ids == self.audio_token_id).sum()) - 1  # earlier turns' pads
            if embeds.shape[0] <= known:
                raise ValueError(f"{embeds.shape[0]} audio embeddings for {known} earlier pads and a turn")
            length = ids.numel() - 1 + embeds.shape[0] - known
            if length > self.max_prompt:
                raise ValueError(
                    f"the spoken turn makes a prompt of {length} tokens, over the {self.max_prompt} "
                    "the context leaves for it: speak for less time"
                )
            prompts.append((ids, slot, embeds.shape[0] - known))
        return {"prompts": prompts}

    def batch_key(self, call: NodeCall):
        return "audio_prompt"

    def forward(self, prompts: list) -> dict:  # type: ignore[override]
        out = []
        for ids, slot, tokens in prompts:
            pads = torch.full((tokens,), self.audio_token_id, dtype=ids.dtype)
            wide = torch.cat([ids[:slot], pads, ids[slot + 1 :]])
            given = wide == self.audio_token_id
            if self.image_token_id is not None:
                given |= wide == self.image_token_id
            out.append((wide, given))
        return {"pairs": out}

    def split_outputs(self, outputs, calls):
        return [{"input_ids": ids, "embed_mask": mask} for ids, mask in outputs["pairs"]]
