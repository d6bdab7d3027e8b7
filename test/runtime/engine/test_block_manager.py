"""BlockManager: allocation, slot mapping, copy-on-write forks, eviction, leak/double-free checks."""

import pytest
import torch

from mstar.engine.block_manager import BlockManager, BlockTable, OutOfBlocks


def test_append_across_block_boundaries():
    bm = BlockManager(num_blocks=8, block_size=4)
    t = BlockTable(blocks=[])
    assert bm.blocks_needed(t, 5) == 2
    assert bm.append(t, 5) == []
    assert len(t.blocks) == 2 and t.num_tokens == 5
    assert bm.num_used_blocks == 2 and bm.num_free_blocks == 6
    assert bm.blocks_needed(t, 3) == 0  # fills the second block exactly
    bm.append(t, 3)
    assert len(t.blocks) == 2 and t.num_tokens == 8
    assert bm.blocks_needed(t, 1) == 1
    bm.append(t, 1)
    assert len(t.blocks) == 3 and t.num_tokens == 9
    assert len(set(t.blocks)) == 3


def test_slot_mapping():
    bm = BlockManager(num_blocks=8, block_size=4)
    t = BlockTable(blocks=[])
    bm.append(t, 10)
    b = t.blocks
    expect = [b[i // 4] * 4 + i % 4 for i in range(10)]
    assert bm.slot_mapping(t, 0, 10).tolist() == expect
    assert bm.slot_mapping(t, 9, 10).tolist() == [b[2] * 4 + 1]
    assert bm.slot_mapping(t, 3, 6).tolist() == expect[3:6]
    assert bm.slot_mapping(t, 0, 10).dtype == torch.int64
    with pytest.raises(IndexError):
        bm.slot_mapping(t, 5, 11)


def test_out_of_blocks_leaves_state_unchanged():
    bm = BlockManager(num_blocks=3, block_size=4)
    t = BlockTable(blocks=[])
    bm.append(t, 6)
    before = (list(t.blocks), t.num_tokens, bm.num_free_blocks)
    assert not bm.can_append(t, 7)  # needs 2 more blocks, 1 free
    with pytest.raises(OutOfBlocks, match="need 2 .* only 1 free"):
        bm.append(t, 7)
    assert (list(t.blocks), t.num_tokens, bm.num_free_blocks) == before
    assert bm.can_append(t, 6)


def test_fork_copy_on_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = BlockTable(blocks=[])
    bm.append(a, 6)  # block0 full, block1 has 2 tokens
    b = bm.fork(a)
    assert b.blocks == a.blocks and b.num_tokens == 6 and b is not a
    assert [bm.ref_count(x) for x in a.blocks] == [2, 2]
    assert bm.num_used_blocks == 2
    # Appending into the shared, partly filled last block must copy it first.
    assert bm.blocks_needed(b, 1) == 1
    full, shared = a.blocks
    copies = bm.append(b, 1)
    assert len(copies) == 1 and copies[0][0] == shared
    new = copies[0][1]
    assert b.blocks == [full, new] and new not in a.blocks
    assert bm.ref_count(full) == 2 and bm.ref_count(shared) == 1 and bm.ref_count(new) == 1
    # The other owner now holds the block alone: no copy.
    assert bm.append(a, 1) == []
    assert a.blocks == [full, shared]
    bm.free(a)
    bm.free(b)
    bm.assert_all_free()


def test_fork_full_last_block_needs_no_copy():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = BlockTable(blocks=[])
    bm.append(a, 8)
    b = bm.fork(a)
    assert bm.append(b, 1) == []
    assert b.blocks[:2] == a.blocks and len(b.blocks) == 3
    bm.free(a)
    bm.free(b)
    bm.assert_all_free()


def test_cow_out_of_blocks():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = BlockTable(blocks=[])
    bm.append(a, 6)
    b = bm.fork(a)
    with pytest.raises(OutOfBlocks):
        bm.append(b, 1)  # the copy needs a block, none free
    assert b.blocks == a.blocks and bm.ref_count(a.blocks[1]) == 2


def test_free_returns_blocks_and_assert_all_free():
    bm = BlockManager(num_blocks=6, block_size=2)
    t1, t2 = BlockTable(blocks=[]), BlockTable(blocks=[])
    bm.append(t1, 3)
    bm.append(t2, 4)
    with pytest.raises(RuntimeError, match="4 of 6"):
        bm.assert_all_free()
    bm.free(t1)
    assert t1.blocks == [] and t1.num_tokens == 0
    assert bm.num_free_blocks == 4
    bm.free(t2)
    assert bm.num_free_blocks == 6
    bm.assert_all_free()


def test_double_free_and_unknown_block_raise():
    bm = BlockManager(num_blocks=4, block_size=2)
    t = BlockTable(blocks=[])
    bm.append(t, 3)
    alias = BlockTable(list(t.blocks), t.num_tokens)  # a copy that was not fork()ed
    bm.free(t)
    with pytest.raises(RuntimeError, match="double free"):
        bm.free(alias)
    assert bm.num_free_blocks == 4
    with pytest.raises(RuntimeError, match="unknown KV block"):
        bm.free(BlockTable([99], 1))


def test_evict_front():
    bm = BlockManager(num_blocks=8, block_size=4)
    t = BlockTable(blocks=[])
    bm.append(t, 14)  # 4 blocks: 4 + 4 + 4 + 2
    first, rest = t.blocks[:2], t.blocks[2:]
    assert bm.evict_front(t, 100) == 0
    assert bm.evict_front(t, 6) == 8  # 14 - 8 = 6 kept; dropping another block would leave 2
    assert t.blocks == rest and t.num_tokens == 6 and t.first_position == 8
    assert all(bm.ref_count(b) == 0 for b in first) and bm.num_free_blocks == 6
    assert bm.evict_front(t, 3) == 0  # 6 - 4 = 2 < 3
    bm.append(t, 1)
    assert bm.slot_mapping(t, 6, 7).tolist() == [t.blocks[1] * 4 + 2]  # table token 6: block 1, offset 2
    bm.free(t)
    bm.assert_all_free()


def test_evict_front_shared_block_stays_with_other_owner():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = BlockTable(blocks=[])
    bm.append(a, 8)
    b = bm.fork(a)
    assert bm.evict_front(b, 4) == 4
    assert bm.ref_count(a.blocks[0]) == 1 and bm.ref_count(a.blocks[1]) == 2
    bm.free(a)
    bm.free(b)
    bm.assert_all_free()


def test_slots_list_matches_slot_mapping():
    bm = BlockManager(8, 4)
    table = BlockTable()
    bm.append(table, 3)
    bm.fork(table)  # the next append copies the shared last block
    bm.append(table, 9)
    for start, end in [(0, 12), (5, 6), (11, 12), (3, 3)]:
        assert bm.slots(table, start, end) == bm.slot_mapping(table, start, end).tolist()
    with pytest.raises(IndexError):
        bm.slots(table, 0, 13)
