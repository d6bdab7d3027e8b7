"""The two system prompts of BAGEL's think mode, as data.

These are the reference's prompt strings (``inferencer.py``: ``VLM_THINK_SYSTEM_PROMPT`` and
``GEN_THINK_SYSTEM_PROMPT``). They are model inputs, kept verbatim (the trailing space before each
newline included) so the model sees what it was trained on. Each enters the context as an ordinary
text turn, first.
"""

from __future__ import annotations

UNDERSTAND_THINK_PROMPT = (
    "You should first think about the reasoning process in the mind and then provide the user with the answer. \n"
    "The reasoning process is enclosed within <think> </think> tags, i.e. <think> reasoning process here </think> "
    "answer here"
)

GENERATE_THINK_PROMPT = (
    "You should first think about the planning process in the mind and then generate the image. \n"
    "The planning process is enclosed within <think> </think> tags, i.e. <think> planning process here </think> "
    "image here"
)
