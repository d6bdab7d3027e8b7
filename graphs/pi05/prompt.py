"""pi0.5 prefixes: camera image placeholders, then the task prompt with the robot state as text.

The text is openpi's pi0.5 format (``PaligemmaTokenizer.tokenize`` with a state):

    <bos> + tokenize("Task: {task}, State: {s_0} {s_1} ...;\\nAction: ")

where ``task`` is the prompt stripped, with ``_`` and newlines turned into spaces,
and ``s_i`` is the state (normalised to [-1, 1] upstream) discretised into 256 bins:
``np.digitize(s, np.linspace(-1, 1, 257)[:-1]) - 1`` (so -1 below the range, 255 at
or above 1 - 1/128). openpi discretises the state as given; LeRobot first zero-pads
it to ``max_state_dim`` (``state_pad_to``, set from a LeRobot config.json).

The image tokens come first: ``cameras * 256`` rows whose ids are a placeholder
(``IMAGE_PLACEHOLDER_ID``, a valid id, never embedded) and whose ``embed_mask`` is
True; the SigLIP node's output fills them. The whole prefix is bidirectional.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

STATE_BINS = 256
IMAGE_PLACEHOLDER_ID = 0  # Gemma's <pad>; rows under embed_mask never look their id up


def discretize_state(state: torch.Tensor | Any) -> list[int]:
    """State [D] (normalised to [-1, 1]) -> bin indices, exactly as openpi's np.digitize
    (the edges -1 + i/128 are exact in float64, so the comparisons are the same)."""
    s = torch.as_tensor(state).detach().reshape(-1).to(torch.float64).cpu()
    if not torch.isfinite(s).all():
        bad = [i for i, ok in enumerate(torch.isfinite(s).tolist()) if not ok]
        raise ValueError(f"state has NaN or infinite values at indices {bad[:8]}")
    edges = torch.arange(STATE_BINS, dtype=torch.float64) / (STATE_BINS / 2) - 1.0
    return [int(b) - 1 for b in torch.bucketize(s, edges, right=True).tolist()]


def clean_task(task: str) -> str:
    return task.strip().replace("_", " ").replace("\n", " ")


def format_prompt(task: str, state: torch.Tensor | Any, *, state_pad_to: int | None = None) -> str:
    """The pi0.5 prompt text (without <bos>). Raises ValueError for an empty task or a bad state."""
    cleaned = clean_task(task)
    if not cleaned.strip():
        raise ValueError("prompt is empty")
    s = torch.as_tensor(state).detach().reshape(-1)
    if s.numel() == 0:
        raise ValueError("state is empty")
    if state_pad_to is not None:
        if s.numel() > state_pad_to:
            raise ValueError(f"state has {s.numel()} values, more than max_state_dim={state_pad_to}")
        s = torch.cat([s.to(torch.float64), s.new_zeros(state_pad_to - s.numel(), dtype=torch.float64)])
    state_str = " ".join(str(b) for b in discretize_state(s))
    return f"Task: {cleaned}, State: {state_str};\nAction: "


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens, from a ``tokenizers.Tokenizer`` or an HF tokenizer."""
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - tokenizers is a dependency
        tokenizers = None
    if tokenizers is not None and isinstance(tokenizer, tokenizers.Tokenizer):
        return list(tokenizer.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_prefix(tokenizer: Any, images_count: int, prompt: str, state: torch.Tensor | Any, *,
                 tokens_per_image: int = 256, bos_id: int = 2, max_token_len: int | None = None,
                 state_pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (input_ids [N] int64, embed_mask [N] bool): ``images_count * tokens_per_image`` image
    placeholders, then <bos> + the prompt text. ``max_token_len`` bounds the text part
    (openpi would truncate, cutting "Action:"; we refuse instead)."""
    if images_count < 0 or tokens_per_image <= 0:
        raise ValueError(f"need images_count >= 0 and tokens_per_image > 0, got {images_count}, {tokens_per_image}")
    text = [bos_id, *encode_text(tokenizer, format_prompt(prompt, state, state_pad_to=state_pad_to))]
    if max_token_len is not None and len(text) > max_token_len:
        raise ValueError(f"prompt is {len(text)} tokens with the state, over max_token_len={max_token_len}")
    n_img = images_count * tokens_per_image
    ids = torch.tensor([IMAGE_PLACEHOLDER_ID] * n_img + text, dtype=torch.int64)
    mask = torch.zeros(ids.shape[0], dtype=torch.bool)
    mask[:n_img] = True
    return ids, mask


def load_tokenizer(directory: str | Path) -> Any:
    """The text tokenizer of a checkpoint directory (its ``tokenizer.json``: the HF fast-tokenizer
    file of PaliGemma, e.g. from google/paligemma-3b-pt-224, for real weights)."""
    import tokenizers

    file = Path(directory) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no tokenizer.json in {directory} (pi0.5 needs PaliGemma's tokenizer.json "
                                f"next to the weights)")
    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ValueError(f"{file}: not a valid tokenizers file: {exc}") from exc
