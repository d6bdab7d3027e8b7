"""Multi-axis RoPE positions a request gives its tokens (mstar.engine.rope_positions): kept with the
sequence, packed per step, and continued from the largest given position after the given tokens."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mstar.engine.block_manager import BlockTable
from mstar.engine.rope_positions import packed_rope_positions, rope_positions_of, set_rope_positions
from mstar.engine.sequence import Sequence


def seq(first: int = 0) -> Sequence:
    table = BlockTable(blocks=[])
    table.first_position = first
    return Sequence(owner="r", node="n", request_id="r", table=table)


def test_tokens_after_the_given_ones_continue_from_the_largest_position():
    s = seq()
    # an image's grid: positions stop growing at 3 although 6 tokens were given
    given = torch.tensor([[0, 1, 1, 1, 1, 4], [0, 1, 1, 2, 2, 4], [0, 1, 2, 1, 2, 4]])
    set_rope_positions(s, given, count=6, before=0, node="n")
    assert torch.equal(rope_positions_of(s, 0, 6, 3), given)
    assert rope_positions_of(s, 6, 9, 3).tolist() == [[5, 6, 7]] * 3  # decode: index + (max + 1 - n)
    assert rope_positions_of(s, 4, 8, 3).tolist() == [[1, 4, 5, 6], [2, 4, 5, 6], [2, 4, 5, 6]]
    # a chunk of a prompt split over steps, inside the given positions
    assert torch.equal(rope_positions_of(s, 1, 4, 3), given[:, 1:4])
    assert torch.equal(rope_positions_of(s, 0, 2, 3), given[:, :2])


def test_a_later_call_keeps_the_earlier_tokens_at_their_index():
    s = seq()
    set_rope_positions(s, torch.tensor([[2, 2], [3, 4], [5, 6]]), count=2, before=3, node="n")
    assert rope_positions_of(s, 0, 5, 3).tolist() == [[0, 1, 2, 2, 2], [0, 1, 2, 3, 4], [0, 1, 2, 5, 6]]
    assert rope_positions_of(s, 5, 6, 3).tolist() == [[7], [7], [7]]


def test_a_step_packs_every_sequence_and_none_without_any():
    a, b = seq(), seq()
    set_rope_positions(a, torch.tensor([[0, 1, 1], [0, 1, 2], [0, 1, 2]]), count=3, before=0, node="n")
    items = [SimpleNamespace(seq=b, start=4, end=6), SimpleNamespace(seq=a, start=0, end=3)]
    assert packed_rope_positions(items).tolist() == [[4, 5, 0, 1, 1], [4, 5, 0, 1, 2], [4, 5, 0, 1, 2]]
    assert packed_rope_positions([SimpleNamespace(seq=b, start=0, end=2)]) is None


@pytest.mark.parametrize(
    "given,match",
    [
        (torch.zeros(3, 4, dtype=torch.long), r"must be \[axes, 5\]"),
        (torch.zeros(3, 5), "must be integers"),
        (torch.full((3, 5), -1), "must not be negative"),
    ],
)
def test_bad_positions_name_the_problem(given, match):
    with pytest.raises(ValueError, match=match):
        set_rope_positions(seq(), given, count=5, before=0, node="thinker")
