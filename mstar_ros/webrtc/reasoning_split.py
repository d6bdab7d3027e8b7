"""A thinking answer split into its reasoning and its reply, as vLLM's and SGLang's reasoning parsers return
them (``reasoning_content`` beside ``content``), whole or while it streams.

A model asked to think (BAGEL's understanding think prompt) answers ``<think> reasoning </think> reply``.
An answer that opens with ``<think>`` is reasoning up to ``</think>`` and reply after it (leading
whitespace of each left out); one cut before ``</think>`` is all reasoning, its reply empty. An answer that
does not open with ``<think>`` is all reply (the model ignored the format): nothing of it is taken away.
While streaming, text that may still become a tag (``<thi`` at the start, ``</th`` at the end of the
reasoning) is held back until the next tokens decide it, so what was sent is never taken back.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split_reasoning(text: str, *, final: bool = True) -> tuple[str | None, str]:
    """(reasoning, reply) of ``text``; reasoning is None when the answer does not open with ``<think>``.
    ``final=False``: the text so far of a streaming answer (undecided tags held back)."""
    body = text.lstrip()
    if not body.startswith(OPEN):
        if not final and OPEN.startswith(body):  # "", "<", "<th": may still open
            return "", ""
        return None, text
    body = body[len(OPEN) :]
    reasoning, closed, reply = body.partition(CLOSE)
    if closed:
        return reasoning.lstrip(), reply.lstrip()
    reasoning = reasoning.lstrip()
    if not final:
        for keep in range(min(len(CLOSE) - 1, len(reasoning)), 0, -1):  # a trailing "</thi" may still close
            if CLOSE.startswith(reasoning[-keep:]):
                reasoning = reasoning[:-keep]
                break
    return reasoning, ""


class ReasoningStream:
    """Deltas of a streaming thinking answer: feed the whole text so far, get what is new of each field."""

    def __init__(self) -> None:
        self._sent = {"reasoning_content": "", "content": ""}

    def feed(self, text: str, *, final: bool = False) -> list[tuple[str, str]]:
        """[(field, new text)] since the last call: ``reasoning_content`` first, then ``content``."""
        reasoning, reply = split_reasoning(text, final=final)
        deltas = []
        for field, now in (("reasoning_content", reasoning or ""), ("content", reply)):
            sent = self._sent[field]
            if len(now) > len(sent) and now.startswith(sent):
                deltas.append((field, now[len(sent) :]))
                self._sent[field] = now
        return deltas
