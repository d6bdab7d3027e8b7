"""Chunk policies as pure functions of (cursor, available, closed)."""

import random

import pytest

from mstar.graph import Chunk, FixedChunkPolicy, LeftContextChunkPolicy, SlidingWindowChunkPolicy, WholeStreamPolicy


def drive(policy, total, steps, close=True):
    """Feeds ``total`` items in increments ``steps`` (cycled), keeping the cursor as the conductor does."""
    cursor, available, chunks, i = 0, 0, [], 0
    while available < total:
        available = min(total, available + steps[i % len(steps)])
        i += 1
        for c in policy.ready(cursor, available, False):
            assert c.end <= available
            chunks.append(c)
            cursor = c.end
    if close:
        for c in policy.ready(cursor, available, True):
            chunks.append(c)
            cursor = c.end
    return chunks


def closing(policy, chunks, total):
    """``chunks`` and what the policy sends when the stream of ``total`` items closes."""
    cursor = chunks[-1].end if chunks else 0
    last = policy.final(cursor, total)
    return chunks + ([last] if last is not None else [])


# -- FixedChunkPolicy ------------------------------------------------------------------------
def test_fixed_exact_chunks():
    p = FixedChunkPolicy(4)
    assert p.ready(0, 3, False) == []
    assert p.ready(0, 4, False) == [Chunk(0, 4)]
    assert p.ready(0, 11, False) == [Chunk(0, 4), Chunk(4, 8)]
    assert p.ready(4, 11, False) == [Chunk(4, 8)]
    assert p.ready(8, 11, False) == []
    assert all(c.left_context == 0 for c in p.ready(0, 40, False))


def test_fixed_remainder_only_on_close():
    p = FixedChunkPolicy(4)
    assert p.ready(8, 11, True) == [Chunk(8, 11)]
    assert p.ready(0, 11, True) == [Chunk(0, 4), Chunk(4, 8), Chunk(8, 11)]
    assert p.ready(8, 8, True) == []  # nothing left: no empty chunk
    assert p.ready(0, 0, True) == []
    assert p.ready(0, 8, True) == [Chunk(0, 4), Chunk(4, 8)]


def test_fixed_incremental_partitions_the_stream():
    p = FixedChunkPolicy(3)
    chunks = drive(p, 17, [1, 2, 5, 1])
    assert [(c.start, c.end) for c in chunks] == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 17)]
    assert drive(p, 17, [17]) == chunks


# -- LeftContextChunkPolicy ------------------------------------------------------------------
def test_left_context_counts():
    p = LeftContextChunkPolicy(chunk=4, left_context=2)
    assert p.ready(0, 3, False) == []
    assert p.ready(0, 4, False) == [Chunk(0, 4, 0)]  # first chunk has no context
    assert p.ready(4, 8, False) == [Chunk(2, 8, 2)]
    chunks = p.ready(0, 12, False)
    assert chunks == [Chunk(0, 4, 0), Chunk(2, 8, 2), Chunk(6, 12, 2)]
    assert [c.new_items for c in chunks] == [4, 4, 4]


def test_left_context_remainder_on_close():
    p = LeftContextChunkPolicy(chunk=4, left_context=2)
    assert p.ready(8, 11, False) == []
    assert p.ready(8, 11, True) == [Chunk(6, 11, 2)]
    chunks = p.ready(0, 10, True)
    assert chunks == [Chunk(0, 4, 0), Chunk(2, 8, 2), Chunk(6, 10, 2)]
    assert [c.new_items for c in chunks] == [4, 4, 2]
    assert p.ready(8, 8, True) == []


def test_left_context_with_a_shorter_first_chunk():
    p = LeftContextChunkPolicy(chunk=4, left_context=2, first_chunk=1)
    assert p.ready(0, 1, False) == [Chunk(0, 1, 0)]  # the first item alone, at once
    assert p.ready(1, 4, False) == []
    assert p.ready(1, 5, False) == [Chunk(0, 5, 1)]  # then chunks of 4 with their context
    assert p.ready(0, 9, False) == [Chunk(0, 1, 0), Chunk(0, 5, 1), Chunk(3, 9, 2)]


def test_left_context_longer_than_what_exists():
    p = LeftContextChunkPolicy(chunk=3, left_context=5)
    assert p.ready(0, 9, False) == [Chunk(0, 3, 0), Chunk(0, 6, 3), Chunk(1, 9, 5)]
    p0 = LeftContextChunkPolicy(chunk=3, left_context=0)
    assert p0.ready(0, 7, True) == [Chunk(0, 3, 0), Chunk(3, 6, 0), Chunk(6, 7, 0)]


def test_left_context_new_items_cover_each_item_once():
    p = LeftContextChunkPolicy(chunk=5, left_context=3)
    chunks = drive(p, 23, [2, 7, 1])
    covered = [i for c in chunks for i in range(c.start + c.left_context, c.end)]
    assert covered == list(range(23))
    assert drive(p, 23, [23]) == chunks


# -- SlidingWindowChunkPolicy ----------------------------------------------------------------
def test_sliding_window_ends():
    p = SlidingWindowChunkPolicy(28, 7)
    assert p.ready(0, 27, False) == []
    assert p.ready(0, 28, False) == [Chunk(0, 28, 0)]
    chunks = p.ready(0, 49, False)
    assert [c.end for c in chunks] == [28, 35, 42, 49]
    assert [c.start for c in chunks] == [0, 7, 14, 21]
    assert [c.left_context for c in chunks] == [0, 21, 21, 21]
    assert [c.new_items for c in chunks] == [28, 7, 7, 7]
    assert p.ready(28, 34, False) == []
    assert p.ready(28, 35, False) == [Chunk(7, 35, 21)]


def test_sliding_window_delivers_nothing_on_close():
    p = SlidingWindowChunkPolicy(28, 7)
    assert p.ready(0, 27, True) == []
    assert p.ready(42, 48, True) == []
    assert [c.end for c in p.ready(0, 48, True)] == [28, 35, 42]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sliding_window_incremental_equals_one_call(seed):
    rng = random.Random(seed)
    p = SlidingWindowChunkPolicy(28, 7)
    steps = [rng.randint(1, 9) for _ in range(40)]
    incremental = drive(p, 100, steps)
    assert incremental == p.ready(0, 100, False) == p.ready(0, 100, True)
    assert [c.end for c in incremental] == list(range(28, 101, 7))


def test_sliding_window_edges_mark_the_first_and_the_last_window():
    p = SlidingWindowChunkPolicy(28, 7, edges=True)
    assert p.ready(0, 28, False) == [], "held back until one more item shows it is not the last"
    assert p.ready(0, 29, False) == [Chunk(0, 28, 0, first=True)]
    chunks = p.ready(0, 42, False)
    assert [c.end for c in chunks] == [28, 35] and [c.first for c in chunks] == [True, False]
    assert p.ready(35, 42, True) == [Chunk(14, 42, 21, final=True)], "at the close: the last window, final"
    assert p.final(42, 42) is None, "nothing left to send"
    assert p.ready(0, 28, True) == [Chunk(0, 28, 0, first=True, final=True)], "the only window is both"
    # Items after the last whole stride sent the last window early: it comes again, all context.
    assert p.ready(35, 45, False) == [Chunk(14, 42, 21)]
    assert p.ready(42, 45, True) == [] and p.final(42, 45) == Chunk(14, 42, 28, final=True)
    assert p.final(0, 23) == Chunk(0, 21, 0, first=True, final=True), "short stream: its whole strides"
    assert p.final(0, 6) is None, "not one whole stride: nothing"
    assert SlidingWindowChunkPolicy(28, 7).final(42, 48) is None, "without edges: the reference behaviour"
    assert FixedChunkPolicy(4).final(8, 9) is None


@pytest.mark.parametrize("n", range(0, 60))
def test_sliding_window_edges_incremental_equals_one_call(n):
    p = SlidingWindowChunkPolicy(28, 7, edges=True)

    def closed_stream(steps: list[int]) -> list[Chunk]:
        cursor, available, chunks = 0, 0, []
        for step in steps:
            available += step
            for c in p.ready(cursor, available, False):
                chunks.append(c)
                cursor = c.end
        for c in p.ready(cursor, available, True):
            chunks.append(c)
            cursor = c.end
        last = p.final(cursor, available)
        return chunks + ([last] if last else [])

    one_by_one = closed_stream([1] * n)
    assert one_by_one == closed_stream([n]) if n else closed_stream([]) == []
    assert sum(c.final for c in one_by_one) == (1 if n >= 7 else 0), "exactly one final chunk"
    assert sum(c.first for c in one_by_one) == (1 if n >= 7 else 0)


def test_window_equal_to_stride_has_no_context():
    p = SlidingWindowChunkPolicy(4, 4)
    assert p.ready(0, 13, True) == [Chunk(0, 4, 0), Chunk(4, 8, 0), Chunk(8, 12, 0)]


# -- invalid arguments -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: FixedChunkPolicy(0), "size must be >= 1, got 0"),
        (lambda: FixedChunkPolicy(-3), "size must be >= 1, got -3"),
        (lambda: LeftContextChunkPolicy(0, 2), "chunk >= 1, left_context >= 0"),
        (lambda: LeftContextChunkPolicy(4, -1), "chunk >= 1, left_context >= 0"),
        (lambda: LeftContextChunkPolicy(4, 2, first_chunk=0), "first_chunk >= 1"),
        (lambda: LeftContextChunkPolicy(4, 0, edges=True), "edges needs left_context >= 1"),
        (lambda: SlidingWindowChunkPolicy(28, 0), "1 <= stride <= window, got window=28, stride=0"),
        (lambda: SlidingWindowChunkPolicy(7, 28), "1 <= stride <= window, got window=7, stride=28"),
    ],
)
def test_invalid_arguments(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


# -- LeftContextChunkPolicy with edges, WholeStreamPolicy -------------------------------------
@pytest.mark.parametrize("total", [1, 3, 4, 5, 8, 9, 13])
def test_left_context_edges_mark_the_first_chunk_and_end_with_a_final_one(total):
    policy = LeftContextChunkPolicy(4, 3, edges=True)
    chunks = closing(policy, drive(policy, total, [1, 2, 3]), total)
    assert [c.first for c in chunks] == [True] + [False] * (len(chunks) - 1)
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].end == total
    news = [i for c in chunks for i in range(c.start + c.left_context, c.end)]
    assert news == list(range(total))  # each item new exactly once
    assert all(c.left_context == min(3, c.start + c.left_context) for c in chunks)


def test_left_context_edges_closing_on_a_chunk_boundary_sends_context_only():
    policy = LeftContextChunkPolicy(4, 3, edges=True)
    assert policy.ready(4, 8, True) == [Chunk(1, 8, 3)]
    assert policy.final(8, 8) == Chunk(5, 8, 3, final=True)


def test_whole_stream_is_one_chunk_at_the_close():
    policy = WholeStreamPolicy()
    assert policy.ready(0, 5, False) == []
    assert policy.ready(0, 5, True) == [Chunk(0, 5)]
    assert policy.ready(0, 0, True) == []
