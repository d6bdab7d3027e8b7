"""A checkpoint's ``tokenizer.json`` (Hugging Face fast-tokenizer file) with errors that say what is wrong."""

from __future__ import annotations

from pathlib import Path

import tokenizers


def load_tokenizer_file(directory: str | Path, model: str) -> tokenizers.Tokenizer:
    file = Path(directory) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no tokenizer.json in {directory} ({model} needs the HF fast-tokenizer file)")
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ValueError(f"{file}: not a valid tokenizers file: {exc}") from exc
