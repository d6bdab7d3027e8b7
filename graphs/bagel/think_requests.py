"""BAGEL's think mode: what its two requests share, and the thought read back as text.

Generation with thinking (the reference's ``interleave_inference(think=True)``) runs as two requests of
one Conductor session. The first (``BagelRequests.think``) lays out the three contexts with the
generation think prompt first (the no-text context: the prompt and any image; the no-image context: the
prompt and the text) and decodes the thought greedily on a copy of the full context. The second
(``BagelRequests.after_thought``) re-tokenizes the thought's text as one text turn, appends it to the full
context only, and generates the image. Understanding with thinking is one request: the answer, with its
reasoning, after the understanding think prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mstar.request import Request
from mstar_graphs.bagel.generation_params import GenerationParams
from mstar_graphs.bagel.tokenizer import IM_END, IM_START, BagelTokenizer

MAX_THINK_TOKENS = 1000  # the reference's max_think_token_n


@dataclass
class ThinkPlan:
    """The first request of a thinking generation and what its second one needs."""

    request: Request  # outputs ``thought_ids``
    session_id: str
    task: Literal["t2i", "edit"]
    params: GenerationParams
    guided: bool
    next_position: int  # the full context's rope counter after its prompt turn


def thought_text(tokenizer: BagelTokenizer, ids: list[int]) -> str:
    """The thought's text from the tokens the think view emitted (after its ``<|im_start|>`` query): the
    decoded text after the first ``<|im_start|>`` up to the next ``<|im_start|>`` or ``<|im_end|>``, as
    the reference reads a decoded text (special tokens kept while decoding)."""
    text = tokenizer.decode([tokenizer.special.im_start, *ids], skip_special_tokens=False)
    after_start = text.partition(IM_START)[2]
    return after_start.partition(IM_START)[0].partition(IM_END)[0]
