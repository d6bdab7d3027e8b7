"""A thinking answer split into reasoning and reply, whole and streamed one character at a time."""

from __future__ import annotations

import pytest

from mstar_ros.webrtc.reasoning_split import ReasoningStream, split_reasoning

CASES = [  # text -> (reasoning, reply)
    ("<think> the cup is red </think> A red cup.", ("the cup is red ", "A red cup.")),
    ("\n<think>\nhmm</think>\n\nyes", ("hmm", "yes")),
    ("<think> cut before the end </th", ("cut before the end </th", "")),  # cut by max_tokens
    ("A plain answer </think> kept whole", (None, "A plain answer </think> kept whole")),
    ("<thinking is not the tag", (None, "<thinking is not the tag")),
    ("", (None, "")),
]


@pytest.mark.parametrize(("text", "want"), CASES)
def test_a_whole_answer_splits_as_vllm_reasoning_parsers_do(text, want):
    assert split_reasoning(text) == want


@pytest.mark.parametrize(("text", "want"), CASES)
def test_streamed_one_character_at_a_time_the_deltas_add_up_to_the_whole_split(text, want):
    stream, got = ReasoningStream(), {"reasoning_content": "", "content": ""}
    for end in range(len(text) + 1):
        for field, piece in stream.feed(text[:end]):
            got[field] += piece
    for field, piece in stream.feed(text, final=True):  # the answer ended: nothing is held back any more
        got[field] += piece
    assert (got["reasoning_content"], got["content"]) == (want[0] or "", want[1])


def test_text_that_may_still_become_a_tag_is_held_back():
    assert split_reasoning("<thi", final=False) == ("", "")
    assert split_reasoning("<think>so </thi", final=False) == ("so ", "")
    assert split_reasoning("<think>a < b", final=False) == ("a < b", "")
