"""Qwen3-Omni chat prompts: turns -> the Thinker's token ids, and reply ids -> text.

ChatML, as Qwen's template lays it out: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per turn, an
image as ``<|vision_start|><|image_pad|> x N<|vision_end|>`` (N: its merged patches), an audio clip as
``<|audio_start|><|audio_pad|> x N<|audio_end|>`` (N: the clip's audio-encoder rows), in that order,
then the generation prompt ``<|im_start|>assistant\\n``. The tokenizer is the checkpoint's
``tokenizer.json`` (Qwen's byte-level BPE; special tokens at their ids). The tiny checkpoint gets a
small byte-level one with every special token at its real id, and the rest of the vocabulary as
filler tokens, so any id the random Thinker picks decodes to something.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tokenizers

from mstar_graphs.common.tokenizer_file import load_tokenizer_file
from mstar_graphs.qwen3_omni.config import Qwen3OmniConfig

SPECIALS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<|audio_start|>": 151669,
    "<|audio_end|>": 151670,
    "<|audio_pad|>": 151675,
    "<tts_pad>": 151671,
    "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673,
}


@dataclass(frozen=True)
class Turn:
    role: str  # "system", "user" or "assistant"
    text: str = ""
    audio_tokens: int = 0  # an audio clip of this many encoder rows, before the text
    image_pads: tuple[int, ...] = ()  # images of this many merged patches each, before the audio


def load_tokenizer(directory: str | Path) -> tokenizers.Tokenizer:
    """The text tokenizer of a checkpoint directory (its ``tokenizer.json``)."""
    return load_tokenizer_file(directory, "Qwen3-Omni")


def prompt_ids(tokenizer: tokenizers.Tokenizer, cfg: Qwen3OmniConfig, turns: list[Turn]) -> list[int]:
    if not turns or turns[-1].role != "user":
        raise ValueError("a chat prompt ends with a user turn")
    ids: list[int] = []
    audio = cfg.thinker_config
    # the role words at the config's ids (the Talker finds the turns by them), as Qwen's tokenizer encodes them
    roles = {"system": cfg.system_token_id, "user": cfg.user_token_id, "assistant": cfg.assistant_token_id}
    newline = tokenizer.encode("\n", add_special_tokens=False).ids
    for turn in turns:
        if turn.role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown role {turn.role!r}")
        if not turn.text.strip() and not turn.audio_tokens and not turn.image_pads:
            raise ValueError(f"an empty {turn.role} turn")
        ids += [cfg.im_start_token_id, roles[turn.role], *newline]
        for pads in turn.image_pads:
            ids += [SPECIALS["<|vision_start|>"], *[SPECIALS["<|image_pad|>"]] * pads, SPECIALS["<|vision_end|>"]]
        if turn.audio_tokens:
            ids += [audio.audio_start_token_id, *[audio.audio_token_id] * turn.audio_tokens, SPECIALS["<|audio_end|>"]]
        if turn.text:
            ids += tokenizer.encode(turn.text, add_special_tokens=False).ids
        ids += [cfg.im_end_token_id, *newline]
    return ids + [cfg.im_start_token_id, roles["assistant"], *newline]


def decode(tokenizer: tokenizers.Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def build_tiny_tokenizer(vocab_size: int) -> tokenizers.Tokenizer:
    """A byte-level BPE over a few words, the specials at Qwen's ids, filler tokens up to ``vocab_size``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(
        [
            "user assistant system hello there how are you today what is the weather like",
            "the robot can hear you and speak back to you in real time",
        ],
        trainer=trainer,
    )
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    taken = set(vocab.values()) | set(SPECIALS.values())
    filler = (i for i in range(vocab_size) if i not in taken)
    for i in filler:  # every id decodes to something (the random Thinker picks any)
        vocab[f"Ġw{i}"] = i
    vocab.update(SPECIALS)
    for word, tid in (("system", 8948), ("user", 872), ("assistant", 77091)):  # Qwen's ids of the role words
        vocab.pop(next((k for k, v in vocab.items() if v == tid), None), None)
        vocab[f"Ġ{word}"] = tid
    data["added_tokens"] = [
        {
            "id": tid,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for text, tid in SPECIALS.items()
    ]
    return Tokenizer.from_str(json.dumps(data))
