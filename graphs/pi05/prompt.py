"""pi0.5 prefixes: camera image placeholders, then the task prompt with the robot state as text.

The text is what both references build (openpi ``PaligemmaTokenizer.tokenize`` with a
state, LeRobot >= 0.5 ``Pi05PrepareStateTokenizerProcessorStep``)::

    <bos> + tokenize("Task: {task}, State: {s_0} {s_1} ...;\\nAction: ")

where ``task`` is the prompt stripped, with ``_`` and newlines turned into spaces, and
``s_i`` is the normalised state discretised into 256 bins:
``np.digitize(s, np.linspace(-1, 1, 257)[:-1]) - 1`` (-1 below the range, 255 at or above
1 - 1/128; nothing is clipped first). Only the state's real dims appear: neither pads it to
``max_state_dim`` first (LeRobot < 0.5 did). A checkpoint trained without the state in the
prompt (openpi ``discrete_state_input=False``, e.g. pi05_libero) gets
``<bos> + tokenize(task) + tokenize("\\n")``. Longer than ``max_len`` tokens, the ids are cut
to the first ``max_len``, as both references truncate (the state's end goes first).

The task changes rarely, the state every request: :class:`PromptEncoder` tokenizes a task
once (``task``), and per request only the short state text, when the tokenizer never merges
across the space before the state (checked once, on every state value); otherwise the whole
text per request.

The image tokens come first: ``cameras * 256`` rows whose ids are a placeholder
(``IMAGE_PLACEHOLDER_ID``, a valid id, never embedded) and whose ``embed_mask`` is True;
the SigLIP node's output fills them. The whole prefix is bidirectional. A camera the
references mask out (a missing one) is simply absent here: masked tokens take no position
and no one attends to them, so leaving them out gives the same result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from mstar_graphs.pi05.tokenizer import TextTokenizer

log = logging.getLogger("mstar_graphs.pi05")

STATE_BINS = 256
IMAGE_PLACEHOLDER_ID = 0  # Gemma's <pad>; rows under embed_mask never look their id up
_STATE_SEP = ", State:"  # the head ends here; the state text starts with a space


class PromptError(ValueError):
    """A prompt that cannot be used (empty, or too long for the checkpoint's token budget)."""


def discretize_state(state: torch.Tensor | Any) -> list[int]:
    """State [D] (normalised) -> bin indices, exactly as np.digitize on the 256 bin edges
    (the edges -1 + i/128 are exact in float64, so the comparisons are the same)."""
    s = torch.as_tensor(state).detach().reshape(-1).to(torch.float64).cpu()
    if not torch.isfinite(s).all():
        bad = [i for i, ok in enumerate(torch.isfinite(s).tolist()) if not ok]
        raise ValueError(f"state has NaN or infinite values at indices {bad[:8]}")
    edges = torch.arange(STATE_BINS, dtype=torch.float64) / (STATE_BINS / 2) - 1.0
    return [int(b) - 1 for b in torch.bucketize(s, edges, right=True).tolist()]


def clean_task(task: str) -> str:
    return task.strip().replace("_", " ").replace("\n", " ")


def _state_text(bins: list[int]) -> str:
    return " " + " ".join(map(str, bins)) + ";\nAction: "


def format_prompt(task: str, state: torch.Tensor | Any) -> str:
    """The pi0.5 prompt text (without <bos>). Raises ValueError for an empty task or a bad state."""
    cleaned = clean_task(task)
    if not cleaned.strip():
        raise PromptError("prompt is empty")
    bins = discretize_state(state)
    if not bins:
        raise ValueError("state is empty")
    return f"Task: {cleaned}{_STATE_SEP}{_state_text(bins)}"


@dataclass(frozen=True)
class TaskPrompt:
    """A task, tokenized once: ``head`` = <bos> + the text before the state (or, without the
    state in the prompt, every id); ``whole`` when the tokenizer needs the full text per request."""

    text: str
    cleaned: str
    head: tuple[int, ...]
    whole: bool


class PromptEncoder:
    """Token ids of pi0.5 prompts for one tokenizer and checkpoint (<bos>, token budget, state or not)."""

    def __init__(
        self, tokenizer: TextTokenizer, *, bos_id: int, max_len: int, state_in_prompt: bool = True, split: bool = True
    ) -> None:
        """``split=False``: always tokenize the whole text (no check; for one-off prompts)."""
        if max_len <= 0:
            raise ValueError(f"max_len must be > 0, got {max_len}")
        self.tokenizer, self.bos_id, self.max_len = tokenizer, bos_id, max_len
        self.state_in_prompt = state_in_prompt
        self.split_safe = state_in_prompt and split and self._splits_before_state()
        if state_in_prompt and split and not self.split_safe:
            log.info("the tokenizer merges across the space before the state: each request tokenizes its whole prompt")

    def _splits_before_state(self) -> bool:
        """Whether ids(head + state text) == ids(head) + ids(state text) for every state value, at
        the first, a middle and the last position (merges across the cut would show there)."""
        enc = self.tokenizer.encode
        for head in (f"Task: go{_STATE_SEP}", f"Task: put the cup in the sink{_STATE_SEP}"):
            head_ids = enc(head)
            for b in range(-1, STATE_BINS):
                tail = _state_text([b, b, b])
                if enc(head + tail) != head_ids + enc(tail):
                    return False
        return True

    def task(self, text: str, *, max_tokens: int | None = None) -> TaskPrompt:
        """Tokenizes a task once. PromptError when it is empty or, with the text around it, already
        ``max_tokens`` tokens (default: the checkpoint's budget) before any state."""
        cleaned = clean_task(text)
        if not cleaned.strip():
            raise PromptError("prompt is empty")
        if self.state_in_prompt:
            head = (self.bos_id, *self.tokenizer.encode(f"Task: {cleaned}{_STATE_SEP}"))
        else:
            head = (self.bos_id, *self.tokenizer.encode(cleaned), *self.tokenizer.encode("\n"))
        cap = self.max_len if max_tokens is None else max_tokens
        room = cap - len(head)  # what is left for the state text (nothing needs to be left without one)
        if room < (1 if self.state_in_prompt else 0):
            raise PromptError(
                f"prompt is {len(head)} tokens before the state, over the limit of {cap} "
                f"(the checkpoint's tokenizer_max_length is {self.max_len})"
            )
        return TaskPrompt(text.strip(), cleaned, head, whole=self.state_in_prompt and not self.split_safe)

    def ids(self, task: TaskPrompt, state: torch.Tensor | Any) -> tuple[list[int], bool]:
        """(<bos> + prompt ids, cut to ``max_len``; whether they were cut) for one state."""
        if not self.state_in_prompt:
            ids = list(task.head)
        else:
            bins = discretize_state(state)
            if not bins:
                raise ValueError("state is empty")
            if task.whole:
                ids = [self.bos_id, *self.tokenizer.encode(f"Task: {task.cleaned}{_STATE_SEP}{_state_text(bins)}")]
            else:
                ids = [*task.head, *self.tokenizer.encode(_state_text(bins))]
        return ids[: self.max_len], len(ids) > self.max_len


def prefix_tensors(
    text_ids: list[int], images_count: int, tokens_per_image: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (input_ids [N] int64, embed_mask [N] bool): ``images_count * tokens_per_image`` image
    placeholders, then the text ids."""
    if images_count < 0 or tokens_per_image <= 0:
        raise ValueError(f"need images_count >= 0 and tokens_per_image > 0, got {images_count}, {tokens_per_image}")
    n_img = images_count * tokens_per_image
    ids = torch.tensor([IMAGE_PLACEHOLDER_ID] * n_img + list(text_ids), dtype=torch.int64)
    mask = torch.zeros(ids.shape[0], dtype=torch.bool)
    mask[:n_img] = True
    return ids, mask


def build_prefix(
    tokenizer: TextTokenizer,
    images_count: int,
    prompt: str,
    state: torch.Tensor | Any,
    *,
    tokens_per_image: int = 256,
    bos_id: int = 2,
    max_token_len: int = 200,
    state_in_prompt: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One observation's (input_ids, embed_mask), without caching (tests, one-off calls)."""
    encoder = PromptEncoder(
        tokenizer, bos_id=bos_id, max_len=max_token_len, state_in_prompt=state_in_prompt, split=False
    )
    ids, _ = encoder.ids(encoder.task(prompt), state)
    return prefix_tensors(ids, images_count, tokens_per_image)
