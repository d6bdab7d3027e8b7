"""PaliGemma's text tokenizer, from whichever file a checkpoint or the user has.

Released pi0.5 checkpoints ship no tokenizer: openpi downloads PaliGemma's SentencePiece
model (``gs://big_vision/paligemma_tokenizer.model``, cached as
``$OPENPI_DATA_HOME/big_vision/paligemma_tokenizer.model``), LeRobot loads
``google/paligemma-3b-pt-224`` with transformers (its ``tokenizer.json``; LeRobot's newest
saves it under ``<checkpoint>/tokenizer/``). Either file gives the same ids. Both
references put ``<bos>`` first and no ``<eos>``: ``encode`` here adds no special token, the
prompt builder adds ``<bos>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

#: where a tokenizer is looked for inside a directory, in this order
FILE_NAMES = (
    "tokenizer.model",
    "paligemma_tokenizer.model",
    "tokenizer.json",
    "tokenizer/tokenizer.model",
    "tokenizer/tokenizer.json",
)


class TokenizerError(ValueError):
    """No tokenizer where one was looked for (the message names every path tried), or an unreadable one."""


class TextTokenizer(Protocol):
    source: Path

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""

    def decode(self, ids: list[int]) -> str: ...

    def vocab_size(self) -> int: ...


class SentencePieceTokenizer:
    """A SentencePiece model file (openpi's ``paligemma_tokenizer.model``)."""

    def __init__(self, file: Path) -> None:
        import sentencepiece

        self.source = file
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(file))
        except (OSError, RuntimeError) as exc:
            raise TokenizerError(f"{file}: not a SentencePiece model: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self._sp.decode(list(ids)))

    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())


class HFTokenizer:
    """A ``tokenizer.json`` (Hugging Face fast-tokenizer file, e.g. google/paligemma-3b-pt-224's)."""

    def __init__(self, file: Path) -> None:
        import tokenizers

        self.source = file
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise TokenizerError(f"{file}: not a valid tokenizer.json: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())


def openpi_cache_file() -> Path:
    """Where openpi keeps the tokenizer it downloads (used when present; never downloaded here)."""
    home = Path(os.environ.get("OPENPI_DATA_HOME", Path.home() / ".cache" / "openpi"))
    return home / "big_vision" / "paligemma_tokenizer.model"


def candidate_files(checkpoint: Path, given: str | Path | None = None) -> list[Path]:
    """The paths looked at, in order: ``given`` (a file, or a directory searched like the checkpoint),
    else the checkpoint directory's files, then openpi's download cache."""
    if given is not None:
        given = Path(given)
        return [given / name for name in FILE_NAMES] if given.is_dir() else [given]
    return [checkpoint / name for name in FILE_NAMES] + [openpi_cache_file()]


def find_tokenizer(checkpoint: Path, given: str | Path | None = None) -> Path:
    """The tokenizer file a load will use; TokenizerError naming every path tried when there is none."""
    tried = candidate_files(checkpoint, given)
    for path in tried:
        if path.is_file():
            return path
    hint = (
        "PaliGemma's tokenizer: openpi's paligemma_tokenizer.model (gs://big_vision/paligemma_tokenizer.model) "
        "or tokenizer.json / tokenizer.model of google/paligemma-3b-pt-224; put it in the checkpoint directory "
        "or pass --tokenizer PATH"
    )
    raise TokenizerError(f"no tokenizer found (tried {', '.join(map(str, tried))}): pi0.5 needs {hint}")


def load_tokenizer(file: str | Path) -> TextTokenizer:
    """A ``.json`` file is a tokenizers file, anything else a SentencePiece model."""
    file = Path(file)
    if not file.is_file():
        raise TokenizerError(f"{file}: no such tokenizer file")
    return HFTokenizer(file) if file.suffix == ".json" else SentencePieceTokenizer(file)
