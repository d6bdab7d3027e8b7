"""BAGEL's text tokenizer: Qwen2.5's ``tokenizer.json`` and the four special tokens BAGEL prompts with.

BAGEL uses no chat template: a text turn is ``<|im_start|>`` + the text's tokens + ``<|im_end|>``
(no role, no newline), an image span is wrapped in ``<|vision_start|>`` ... ``<|vision_end|>``, and
decoding starts from ``<|im_start|>`` and stops at ``<|im_end|>``. The ids are read from the
tokenizer (Qwen2.5 has them at 151644, 151645, 151652, 151653; our tiny tokenizer elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tokenizers

from mstar_graphs.common.tokenizer_file import load_tokenizer_file

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
SPECIAL_TOKENS = (IM_START, IM_END, VISION_START, VISION_END)


@dataclass(frozen=True)
class SpecialIds:
    im_start: int  # BAGEL's bos: starts every text turn and every decode
    im_end: int  # BAGEL's eos: ends a turn; decoding stops on it
    vision_start: int  # before an image span's rows
    vision_end: int  # after them


class BagelTokenizer:
    def __init__(self, tokenizer: tokenizers.Tokenizer, source: str = "tokenizer") -> None:
        self._tok = tokenizer
        self.source = source
        ids = {}
        for text in SPECIAL_TOKENS:
            tid = tokenizer.token_to_id(text)
            if tid is None:
                raise ValueError(f"{source}: no token {text} (BAGEL needs {', '.join(SPECIAL_TOKENS)})")
            ids[text] = tid
        self.special = SpecialIds(ids[IM_START], ids[IM_END], ids[VISION_START], ids[VISION_END])

    @classmethod
    def from_dir(cls, path: str | Path) -> BagelTokenizer:
        """``<path>/tokenizer.json`` (the HF fast-tokenizer file of Qwen2.5 that a BAGEL release ships)."""
        return cls(load_tokenizer_file(path, "BAGEL"), source=str(Path(path) / "tokenizer.json"))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the reference's ``tokenizer.encode(text)`` gives them (Qwen2's
        tokenizer adds no special token to a single text)."""
        return list(self._tok.encode(text).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def text_turn(self, text: str) -> list[int]:
        """One prompt turn: ``[<|im_start|>] + encode(text) + [<|im_end|>]``."""
        return [self.special.im_start, *self.encode(text), self.special.im_end]

    def vocab_size(self) -> int:
        """Tokens the tokenizer knows (the LLM's embedding table may have more rows)."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))
