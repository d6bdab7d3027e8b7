"""similar_length_groups: which sequences share a padded attention call."""

import pytest

from mstar.engine.attention.length_groups import similar_length_groups


def test_guidance_branches_split_by_context_length():
    # An edit's three flow branches: full, no text (similar) and no image (short).
    assert similar_length_groups([3298, 3279, 1045], query_len=10) == [[0, 1], [2]]


def test_large_sequences_run_alone_and_equal_small_ones_share():
    assert similar_length_groups([3298, 3279, 1045], query_len=1026) == [[0], [1], [2]]
    assert similar_length_groups([50, 50, 50, 50], query_len=1) == [[0, 1, 2, 3]]


def test_decodes_keep_input_order_within_a_group_and_padding_stays_bounded():
    lens = [30, 3000, 25, 2900, 1, 28]
    groups = similar_length_groups(lens, query_len=1)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(g == sorted(g) for g in groups)
    assert [1, 3] in groups
    for g in groups:
        padded, own = len(g) * max(lens[i] for i in g), sum(lens[i] for i in g)
        assert padded <= 1.25 * own + 64 * len(g)


def test_rejects_an_empty_query():
    with pytest.raises(ValueError, match="query_len"):
        similar_length_groups([4], query_len=0)
