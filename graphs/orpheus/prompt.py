"""Orpheus prompts: text (and a voice name) -> the token ids the LLM continues with speech.

Layout, as the reference ``orpheus_tts`` package builds it at the id level:

    [START_OF_HUMAN] + tokenizer("{voice}: {text}") + [EOT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]

``tokenizer(...)`` includes whatever the tokenizer's post-processor adds (the real
Llama 3 tokenizer prepends <|begin_of_text|>), so the ids match the reference's
``tokenizer(prompt).input_ids``.
"""

from __future__ import annotations

from pathlib import Path

import tokenizers

from mstar_graphs.common.tokenizer_file import load_tokenizer_file
from mstar_graphs.orpheus.tokens import END_OF_HUMAN, EOT, START_OF_AI, START_OF_HUMAN, START_OF_SPEECH

PROMPT_SUFFIX = (EOT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH)


def load_tokenizer(directory: str | Path) -> tokenizers.Tokenizer:
    """The text tokenizer of a checkpoint directory (its ``tokenizer.json``)."""
    return load_tokenizer_file(directory, "Orpheus")


def build_prompt_ids(tokenizer: tokenizers.Tokenizer, text: str, voice: str | None = "tara") -> list[int]:
    """Prompt token ids for speaking ``text`` in ``voice`` (None or "": no voice prefix)."""
    if not text or not text.strip():
        raise ValueError("text is empty")
    spoken = f"{voice}: {text}" if voice else text
    ids = tokenizer.encode(spoken).ids  # add_special_tokens=True, as HF tokenizer(...) does
    return [START_OF_HUMAN, *ids, *PROMPT_SUFFIX]
